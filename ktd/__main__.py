import sys

from ktd.cli import main

sys.exit(main())
