"""Restart policy (pure): the crash budget, the crash backoff, and the retry delay.

A crash of a ready engine is restarted after ``backoff * 2**n`` seconds (at most
``BACKOFF_CAP``), until more than ``max_crashes`` crashes fall within ``window``
seconds: then the engine is flapping and fails. A failed engine may be retried
by a request ``backoff * 2**(failures-1)`` seconds after its last failure (at most
``RETRY_CAP``).
"""

from __future__ import annotations

from collections import deque

from ktd.core.action import MachineAction

__all__ = [
    "BACKOFF_CAP",
    "RETRY_CAP",
    "Action",
    "GiveUp",
    "Restart",
    "RestartBudget",
    "retry_delay",
]

BACKOFF_CAP = 60.0  # longest wait before a crashed engine is restarted
RETRY_CAP = 300.0  # longest wait before a failed engine may be retried by a request


class Restart(MachineAction):
    """Restart after ``delay`` seconds."""

    delay: float


class GiveUp(MachineAction):
    """Too many crashes: fail with ``reason``."""

    reason: str


Action = Restart | GiveUp


class RestartBudget:
    """The crashes of one load (a new explicit load starts a fresh budget)."""

    def __init__(self) -> None:
        self.crashes: deque[float] = deque()
        self.attempt = 0  # restarts so far in this load: the backoff's exponent

    def reset(self) -> None:
        self.crashes.clear()
        self.attempt = 0

    def on_crash(
        self, now: float, reason: str, *, window: float, max_crashes: int, backoff: float
    ) -> Action:
        """Count a crash at ``now`` (a monotonic clock) and say what follows."""
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > window:
            self.crashes.popleft()
        if len(self.crashes) > max_crashes:
            return GiveUp(
                f"flapping: {len(self.crashes)} crashes within {window:g}s; last: {reason}"
            )
        delay = min(BACKOFF_CAP, backoff * (2**self.attempt))
        self.attempt += 1
        return Restart(delay)


def retry_delay(failures: int, backoff: float) -> float:
    """How long after its n-th consecutive failure a request may retry the engine:
    ``backoff * 2**(n-1)`` seconds, at most ``RETRY_CAP``; 0 without failures."""
    if failures <= 0:
        return 0.0
    base = max(0.0, backoff)
    return float(min(RETRY_CAP, base * 2.0 ** min(failures - 1, 20)))
