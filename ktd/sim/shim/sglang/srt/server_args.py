"""``ServerArgs.add_cli_args``: how real SGLang (upstream and kt fork) declares its options.

ktd's probe builds ``argparse.ArgumentParser()`` and calls this, as SGLang's
``prepare_server_args`` does; the shim declares the options of the SGLang the
sim plays (``ktd.sim.flags``), found next to this shim as ``launch_server`` finds it.
"""

from __future__ import annotations

import argparse
import os
import sys


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
        )
        if os.path.isfile(os.path.join(root, "ktd", "sim", "flags.py")) and root not in sys.path:
            sys.path.insert(0, root)
        from ktd.sim.flags import add_cli_args

        add_cli_args(parser)
