"""``python -m sglang.launch_server [flags]`` -> ``ktd.sim``'s main, same argv.

The shim finds the ``ktd`` package it ships in (three directories up: this
file is ``ktd/sim/shim/sglang/launch_server.py``) and puts that tree first on
``sys.path``, so only the shim directory has to be on ``PYTHONPATH`` and the
sim that runs is the one next to the shim, not another installed ktd.
"""

import os
import sys


def _ktd_root() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))


def main() -> int:
    root = _ktd_root()
    if os.path.isfile(os.path.join(root, "ktd", "sim", "app.py")) and root not in sys.path:
        sys.path.insert(0, root)
    from ktd.sim.app import main as sim_main

    return sim_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
