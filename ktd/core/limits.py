"""Admission's limits (``ktd.core.admission``): one rule book for the daemon's gate and the
frontend's desk.

The limits, with one meaning on both sides and in every situation (a fresh
frontend, after an evict, while loading):

* ``max_concurrent``: requests in flight on the engine at once (unset: no limit).
* ``max_queue``: how many requests may wait *behind other requests* for a slot.
  The first ``max_concurrent - in flight`` waiting requests (all of them without
  ``max_concurrent``) are not queued: they will be served the moment the engine
  is up, and only wait for its load or swap. ``0``: no request ever waits for
  another request to end; a cold model is still loaded by the request that wants it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["QueueLimits"]


@dataclass(frozen=True)
class QueueLimits:
    max_concurrent: int | None = None
    max_queue: int | None = None

    def free(self, in_flight: int) -> float:
        """Slots free now (inf without ``max_concurrent``)."""
        if self.max_concurrent is None:
            return math.inf
        return max(0, self.max_concurrent - in_flight)

    def may_join(self, *, in_flight: int, waiting: int) -> bool:
        """Whether one more request may wait, ``waiting`` already doing so."""
        if self.max_queue is None:
            return True
        return waiting < self.free(in_flight) + self.max_queue

    def full_message(self, waiting: int) -> str:
        return f"{waiting} request(s) already waiting (max_queue {self.max_queue})"
