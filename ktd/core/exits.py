"""Exit classification (pure): what an engine's exit means, from its code and log tail.

A ready engine that exits 0 stopped on its own (an outside SIGTERM); any other exit
of a ready engine is a crash (restarted per policy). Before ready, an exit is a
failed load, named by the first real error of its log, or a port taken between
ktd's pick and SGLang's bind (retried once on another port).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ktd.core.failure import reason_line

__all__ = [
    "CLEAN_STOP",
    "PORT_TAKEN_MARKERS",
    "RETRIED",
    "Outcome",
    "classify_exit",
    "describe_exit",
    "signal_name",
]

OutcomeKind = Literal[
    "stopped", "exited", "failed", "crashed", "port_taken", "fewer_experts", "busy"
]
#: Exits before ready launched again at once, once a load: what the note adds to the
#: reason (``fewer_experts``: ``ktd.core.gpuexperts``'s retry says its count itself).
RETRIED = {"port_taken": "; retrying once on another port", "fewer_experts": ""}

PORT_TAKEN_MARKERS = ("address already in use", "errno 98")

# SGLang's own exit statuses after ktd's SIGTERM (docs/sglang.md, "Processes and shutdown"): 0 after
# a drain (upstream), -15 (a shell's 143) when no request was ever served, -9 when the kt
# fork SIGKILLs its own tree once drained. None of them is a crash. A wrapper shell that
# runs SGLang as its child reports a signal as 128+N.
CLEAN_STOP = frozenset(
    {0, -signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGKILL}
)


@dataclass
class Outcome:
    """How one run of an engine ended."""

    kind: OutcomeKind
    reason: str | None = None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def describe_exit(code: int | None) -> str:
    """``exited``, ``exited with code 1``, ``was killed by SIGKILL``."""
    if code is None:
        return "exited"
    if code >= 0:
        return f"exited with code {code}"
    return f"was killed by {signal_name(-code)}"


def classify_exit(
    code: int | None,
    *,
    was_ready: bool,
    port: int,
    port_fixed: bool,
    tail: Sequence[str],
    log_path: str,
) -> Outcome:
    """The outcome of an exit nobody asked for. ``tail`` is the log's last lines
    (80 suffice); ``port_fixed`` = the port came from the config (no retry)."""
    how = describe_exit(code)
    if was_ready:
        if code == 0:
            return Outcome("exited", f"engine {how} on its own while ready")
        return Outcome("crashed", f"engine {how} while ready")
    recent = "\n".join(tail[-40:]).lower()
    if not port_fixed and any(m in recent for m in PORT_TAKEN_MARKERS):
        return Outcome("port_taken", f"port {port} was taken before the engine bound it")
    return Outcome("failed", reason_line(how, list(tail[-80:]), log_path))
