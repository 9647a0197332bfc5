"""``python -m ktd.sim [sglang.launch_server flags]``."""

import sys

from ktd.sim.app import main

if __name__ == "__main__":
    sys.exit(main())
