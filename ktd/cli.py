"""``ktd``: the daemon's command (``serve``), the frontend (``frontend``) and ``up``.

Subcommands import their module lazily so that each process pays only for
what it runs.
"""

from __future__ import annotations

import sys

USAGE = """usage: ktd {serve,frontend,up,init,version} [options]

  serve      run the daemon that owns the engines (ZeroMQ control socket)
  frontend   run the OpenAI-compatible HTTP frontend
  up         run daemon and frontend together (--demo: on the simulated engine)
  init       write a starter config.json and models.json (never overwrites)
  version    print the version

Run `ktd COMMAND --help` for the options of each command.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "serve":
        from ktd.daemon import main as daemon

        return daemon.main(rest)
    if cmd == "frontend":
        from ktd.frontend import main as frontend

        return frontend.main(rest)
    if cmd == "up":
        from ktd import up

        return up.main(rest)
    if cmd == "init":
        from ktd import init

        return init.main(rest)
    if cmd in ("version", "--version"):
        from ktd import __version__

        print(__version__)
        return 0
    print(f"ktd: unknown command {cmd!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
