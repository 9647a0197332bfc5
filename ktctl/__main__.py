"""``python -m ktctl``: the same as the ``ktctl`` console script."""

from ktctl.cli import main

raise SystemExit(main())
