"""Sleep or reload, on an SGLang without a door (pure: the clock and the figures come in).

A sleep is worth it when waking the engine again is quicker than loading it afresh. On an
SGLang with ``/pause_generation`` it is (a release and a resume take seconds, a load
minutes). On one without it, the fence has nothing but zero ``/v1/loads`` readings for
longer than SGLang's republish interval (``REPUBLISH``, ``docs/sglang.md``, "Sleep"): two
seconds at least, paid on every sleep, inside a swap that waits for the room. For a model
that loads in a few seconds that made a swap slower than a reload (issue 43: two models
alternating, p95 5.6 s against a 4.9 s cold load).

So, when the door turns out to be missing (the pause's 404), the engine is stopped
instead of put to sleep if its sleep and its wake, as measured on this engine (this
daemon's life), cost at least its reload, as measured by the load history
(``ktd.daemon.pool.loadhistory``). Until a no-door sleep or a wake has been measured its cost
counts as the least it can be (``REPUBLISH``; no wake): the engine is stopped only when
sleeping is sure to be slower, and sleeps otherwise (which measures it). The stop's own
time is not counted: it is short, and an asleep engine is stopped in the end too.

The driver (``ktd.daemon.engine.supervisor``) keeps one ``Costs`` per engine, tells it when each
measured step begins and ends, and asks it at the pause's 404 (``no_door``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["KEEP", "REPUBLISH", "Costs", "Fence", "without_door"]


class Fence(StrEnum):
    """How far a sleep's fence got (``ktd.core.lifecycle``): SGLang holds new requests
    (``paused``: a resume must open the door again), or this SGLang has no door to close
    (``reads``: zero readings for ``REPUBLISH`` stand in, when a sleep is worth it)."""

    PAUSED = "paused"
    READS = "reads"


#: Seconds of zero ``/v1/loads`` readings that stand in for a fence on an SGLang without
#: ``/pause_generation``: upstream republishes its load snapshot at least every 15 decode
#: steps (``--load-snapshot-publish-interval``), well under this for a model that serves.
REPUBLISH = 2.0

#: Recent measurements kept of each step (their median is the expected cost).
KEEP = 5


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


@dataclass
class Costs:
    """One engine's measured sleep steps, in seconds: ``sleeps``, from the pause's 404 to
    asleep (the fence's zero readings and the release); ``wakes``, from the resume asked
    to ready again (the resume, the door, the readiness check; the room made before is
    another engine's cost)."""

    sleeps: list[float] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)
    sleep_since: float | None = None  # a no-door sleep's fence began then
    wake_since: float | None = None  # a resume was asked then

    def no_door(self, now: float, reload: float | None) -> str | None:
        """The pause's 404: a no-door sleep's fence begins now, unless it costs at least
        a reload (``without_door``: then why the engine is stopped instead)."""
        self.sleep_since = now
        return without_door(self, reload)

    def asleep(self, now: float) -> None:
        """Asleep: the no-door sleep under way (if any) took until now."""
        if self.sleep_since is not None:
            self.sleeps = _keep(self.sleeps, now - self.sleep_since)
        self.sleep_since = None

    def resume_asked(self, now: float) -> None:
        self.wake_since = now

    def ready(self, now: float) -> None:
        """Ready: the wake under way (if any) took until now."""
        if self.wake_since is not None:
            self.wakes = _keep(self.wakes, now - self.wake_since)
        self.wake_since = None

    def ended(self) -> None:
        """The run ended (stopped, failed): a step under way measured nothing."""
        self.sleep_since = self.wake_since = None

    def sleep_cost(self) -> float:
        """A no-door sleep's expected cost: measured, else the least it can be."""
        measured = _median(self.sleeps)
        return measured if measured is not None else REPUBLISH

    def wake_cost(self) -> float:
        measured = _median(self.wakes)
        return measured if measured is not None else 0.0


def _keep(values: list[float], value: float) -> list[float]:
    return [*values, max(value, 0.0)][-KEEP:]


def without_door(costs: Costs, reload: float | None) -> str | None:
    """At the pause's 404: None to sleep on zero readings, else why the engine is stopped
    instead (its status reason and the sleep's answer). ``reload``: the expected load
    time from the load history (None: never measured, and then it sleeps)."""
    if reload is None:
        return None
    sleep, wake = costs.sleep_cost(), costs.wake_cost()
    if sleep + wake < reload:
        return None
    woke = f" and a wake {wake:.1f}s" if costs.wakes else ""
    return (
        f"stopped instead of sleeping: this SGLang has no /pause_generation, so a sleep "
        f"takes {sleep:.1f}s here{woke} (zero load readings for {REPUBLISH:g}s stand in "
        f"for the fence), against {reload:.1f}s for a reload"
    )
