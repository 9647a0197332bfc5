"""A stand-in ``sglang`` package: ``python -m sglang.launch_server`` runs ktd's simulated engine.

Put ``ktd/sim/shim`` on ``PYTHONPATH`` and ktd's real engine code path (the
probe imports ``sglang`` and ``kt_kernel`` and reads the options from
``sglang.srt.server_args.ServerArgs.add_cli_args``, then
``<python> -m sglang.launch_server ...``) runs against the sim. Importing this
package costs nothing beyond ``os``: ktd's probe imports it to read the version,
which follows the SGLang the sim plays (``KTD_SIM_SGLANG``: ``kt`` or ``upstream``).
"""

import os

__version__ = {"upstream": "0.5.23"}.get(os.environ.get("KTD_SIM_SGLANG", "kt"), "0.7.2") + "+sim"
