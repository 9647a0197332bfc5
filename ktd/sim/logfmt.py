"""Log lines in SGLang's and (SGLang-configured) uvicorn's formats, on stdout.

Why imitate the format: ktd shows engine log tails to operators and tests look
for the milestones real SGLang prints (``Load weight begin``, ``Uvicorn running
on``, ``The server is fired up and ready to roll!``, uvicorn's bind error).
SGLang formats its own lines as ``[YYYY-mm-dd HH:MM:SS] msg`` (``[... TP0]`` in
the scheduler) and reconfigures uvicorn to ``[time] LEVEL:    msg``.

Every line is written and flushed at once, so a parent reading a pipe or a log
file sees it immediately. Stdlib only: the scheduler child imports it.
"""

from __future__ import annotations

import sys
import time


def _ts() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _write(line: str) -> None:
    try:
        sys.stdout.write(line)
        sys.stdout.flush()
    except (OSError, ValueError):
        # A closed or broken stdout must never take the engine down.
        pass


def log(message: str, prefix: str = "") -> None:
    """An SGLang line; ``prefix`` is e.g. ``" TP0"`` for scheduler lines."""
    _write(f"[{_ts()}{prefix}] {message}\n")


def uvicorn(level: str, message: str) -> None:
    """A uvicorn line as SGLang configures it: ``[time] INFO:     message``."""
    levelprefix = f"{level}:" + " " * max(0, 8 - len(level))
    _write(f"[{_ts()}] {levelprefix} {message}\n")


def line_buffered() -> None:
    """Make stdout line-buffered even when it is a file or a pipe (not a tty)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(line_buffering=True)
        except (OSError, ValueError):
            pass
