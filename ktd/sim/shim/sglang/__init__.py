"""A stand-in ``sglang`` package: ``python -m sglang.launch_server`` runs ktd's simulated engine.

Put ``ktd/sim/shim`` on ``PYTHONPATH`` and ktd's real engine code path (probe
``import sglang, kt_kernel``, then ``<python> -m sglang.launch_server ...``)
runs against the sim. Importing this package is free: no imports, no side
effects, because ktd's probe imports it just to read the version.
"""

__version__ = "0.0.0-sim"
