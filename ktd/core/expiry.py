"""Idle expiry (pure): clients that went silent, and engines idle for their TTL.

Two clocks run out here, both on the daemon's monotonic clock:

* *A client's leases and claims* (a frontend, a local tool) expire ``lease_ttl``
  after the daemon last heard from it: it died, and its requests are not coming back.
* *An engine's idle TTL* runs from the end of its last request. An engine on which
  a frontend holds a claim is never evicted by the TTL: the daemon asks for the
  claim back (an ``idle`` recall), and the frontend, which counts its own requests,
  gives it back only if it really had none for that long. Only an engine nobody
  holds (no claim, no lease, nobody waiting) is evicted.

Both are judged on the daemon's running time only. The sweep is scheduled every
``lease_ttl / 3``; one that wakes late was held up (SIGSTOP, starvation), and what
it would measure over that time is its own silence, not the clients': their
heartbeats and reports sit unread in the socket. So every client is credited with
the time the sweep lost; late by more than ``lease_ttl / 2`` counts as a pause, and
TTL decisions then wait one more interval (*settling*), so the reports that queued
up during the pause are read before anything is judged idle. A restarted daemon
starts settled on nothing: restored claims count as busy until their holder
reports (``ktd.core.claimsync``), and its clients' clocks start when it starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ktd.core.action import MachineAction
from ktd.core.states import ASLEEP, READY, State

__all__ = ["EvictIdle", "Expire", "Expiry", "IdleView", "RecallIdle", "SleepIdle", "ttl_due"]


@dataclass(frozen=True)
class IdleView:
    """What the TTL reads of an engine."""

    alias: str
    ttl: float
    state: State
    want_up: bool
    in_flight: int  # requests in flight (leases, claims' reports; an unconfirmed claim is busy)
    claims: int  # standing claims on it
    waiting: int  # requests in its line
    idle_since: float  # monotonic: the end of its last request (or when it became ready)
    sleeps: bool = False  # its TTL puts it to sleep instead of stopping it
    sleep_ttl: float = 0.0  # asleep this long: stopped (0: never)
    asleep_at: float | None = None  # monotonic: when it fell asleep


class Expire(MachineAction):
    clients: frozenset[str]


class RecallIdle(MachineAction):
    """Ask the claim holders for it back if they had no request for ``idle`` seconds."""

    alias: str
    idle: float


class EvictIdle(MachineAction):
    alias: str
    ttl: float


class SleepIdle(MachineAction):
    """Its TTL ran out and it can sleep: put it to sleep (a second TTL stops it later)."""

    alias: str
    ttl: float


Action = Expire | RecallIdle | EvictIdle | SleepIdle


def ttl_due(view: IdleView) -> float | None:
    """When the TTL runs out (monotonic); None without one, or while busy, loading or going.
    Asleep: when its ``sleep_ttl`` runs out."""
    if view.state == ASLEEP and not view.want_up:
        if view.sleep_ttl <= 0 or view.asleep_at is None or view.waiting:
            return None
        return view.asleep_at + view.sleep_ttl
    if view.ttl <= 0 or view.state != READY or view.in_flight or view.waiting or not view.want_up:
        return None
    return view.idle_since + view.ttl


class Expiry:
    """Every client's last word and the TTL decisions of one daemon run."""

    def __init__(self, lease_ttl: float, now: float) -> None:
        self.lease_ttl = max(lease_ttl, 0.5)
        self.seen: dict[str, float] = {}
        self.last_sweep = now
        self.settled_at = now  # TTL decisions from here on (after a pause: one interval on)
        self.paused = 0  # pauses seen (for the log)

    @property
    def interval(self) -> float:
        return self.lease_ttl / 3

    def heard(self, client: str, now: float) -> None:
        self.seen[client] = now

    def forget(self, client: str) -> None:
        self.seen.pop(client, None)

    def sweep(self, now: float) -> Expire | None:
        """The client sweep, every ``interval``. None: nobody expires.

        A sweep that runs late was held up (the daemon stopped or starved), and the
        time it lost is nobody's silence: every client is credited with it, so a client
        is expired only after ``lease_ttl`` of the daemon's *running* time without a
        word. Late by more than ``lease_ttl / 2`` counts as a pause: TTL decisions then
        settle for one interval, so the reports queued meanwhile are read first.
        """
        late = max(0.0, now - (self.last_sweep + self.interval))
        self.last_sweep = now
        if late > 0:
            for client, heard in self.seen.items():
                self.seen[client] = min(now, heard + late)
        if late > self.lease_ttl / 2:
            self.paused += 1
            self.settled_at = now + self.interval
        dead = frozenset(c for c, t in self.seen.items() if now - t > self.lease_ttl)
        for client in dead:
            del self.seen[client]
        return Expire(dead) if dead else None

    def next_sweep(self) -> float:
        return self.last_sweep + self.interval

    def idle(
        self, engines: Iterable[IdleView], now: float
    ) -> tuple[list[RecallIdle | EvictIdle | SleepIdle], float]:
        """TTL decisions for every engine whose TTL ran out, and when the next one runs
        out (an engine acted on is looked at again when it changes, not before)."""
        if now < self.settled_at:
            return [], self.settled_at  # after a pause: the queued reports first
        if now - self.last_sweep > self.interval + self.lease_ttl / 2:
            return [], now  # the sweep is overdue: a pause it has not judged yet
        out: list[RecallIdle | EvictIdle | SleepIdle] = []
        next_due = math.inf
        for view in engines:
            due = ttl_due(view)
            if due is None:
                continue
            if due > now:
                next_due = min(next_due, due)
            elif view.state == ASLEEP:
                out.append(EvictIdle(view.alias, view.sleep_ttl))
            elif view.claims:
                out.append(RecallIdle(view.alias, view.ttl))
            elif view.sleeps:
                out.append(SleepIdle(view.alias, view.ttl))
            else:
                out.append(EvictIdle(view.alias, view.ttl))
        return out, next_due
