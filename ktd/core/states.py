"""The engine state machine (pure): states, legal moves, and what each state allows.

``stopped → starting → ready → draining → stopping → stopped``, plus ``failed``.
Only an engine's own supervisor task moves it; a move not listed here is a bug,
so ``check`` raises instead of letting the pool drift from the processes.
"""

from __future__ import annotations

STOPPED = "stopped"
STARTING = "starting"
READY = "ready"
DRAINING = "draining"
STOPPING = "stopping"
FAILED = "failed"

ALL = (STOPPED, STARTING, READY, DRAINING, STOPPING, FAILED)

TRANSITIONS: dict[str, frozenset[str]] = {
    STOPPED: frozenset({STARTING, FAILED}),
    # starting → starting: a retry (port taken at bind, crash backoff).
    STARTING: frozenset({STARTING, READY, STOPPING, FAILED, STOPPED}),
    # ready → starting: a crash restart under the restart policy.
    READY: frozenset({DRAINING, STOPPING, STARTING, FAILED, STOPPED}),
    DRAINING: frozenset({STOPPING}),
    STOPPING: frozenset({STOPPED, FAILED, STARTING}),
    FAILED: frozenset({STARTING, STOPPED}),
}

# States in which the engine holds NUMA nodes, GPUs and a port.
HOLDS_RESOURCES = frozenset({STARTING, READY, DRAINING, STOPPING})
# States in which processes may exist.
HAS_PROCESSES = HOLDS_RESOURCES


class IllegalTransition(RuntimeError):
    pass


def check(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise IllegalTransition(f"engine state {old} -> {new} is not allowed")
