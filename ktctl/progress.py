"""The rewritten progress line of ``ktctl load``, ``sleep`` and ``wake`` on a terminal.

The text is ``render.LoadProgress``'s; this writes it to stderr in place (carriage
return, erase line) and wipes it before the result. Shown only on a terminal and
without ``--json`` (``ktctl.cli``); tested on a real pty (``tests/ktctl/test_terminal_e2e.py``).
"""

from __future__ import annotations

import os
import sys
import time

from ktctl import render
from ktd import protocol as p


def terminal_width() -> int:
    """Columns of the terminal (``$COLUMNS`` wins, as with shutil); 80 if unknown."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError):
            columns = 0
    return columns if columns > 0 else 80


class ProgressLine:
    """Rewrites one stderr line in place while a load is waited for."""

    def __init__(self, alias: str, started: float, state: str = "loading") -> None:
        self.state = render.LoadProgress(alias, started, state)
        self.shown = False

    def __call__(self, ev: p.Event | None) -> None:
        if ev is not None:
            self.state.update(ev)
        line = self.state.line(time.monotonic(), terminal_width())
        sys.stderr.write("\r\x1b[K" + line)
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False
