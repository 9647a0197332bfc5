"""Admission on the daemon (pure; ``ktd.core.admission`` has the rules): one ``Gate`` per
engine admits acquire leases and the frontends' claim requests, in one line ordered by
arrival tickets that count across engines, and holds back the requests that arrived
after a swap began (*yielding*). ``ktd.daemon.pool.gate`` carries out its actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ktd.core.action import MachineAction
from ktd.core.limits import QueueLimits
from ktd.core.states import ASLEEP, FAILED, READY, STARTING, STOPPED, WAKING, State

__all__ = ["Answer", "EngineView", "Gate", "GateAction", "GateWaiter", "WaitEnd", "WantUp"]


class WaitEnd(StrEnum):
    """How a wait ended (the daemon renders each as a reply, ``ktd.daemon.pool.gate``)."""

    GRANTED = "granted"
    TIMEOUT = "timeout"
    QUEUE_FULL = "queue_full"
    NOT_LOADED = "not_loaded"  # not loaded and the request may not load it (autoload off)
    RETRY_LATER = "retry_later"  # failed, and its retry backoff has not run out
    ATTEMPT_ENDED = "attempt_ended"  # the load it waited for ended without ready
    REMOVED = "removed"  # the model left the config while it waited
    CLOSED = "closed"  # the daemon shuts down


@dataclass(frozen=True)
class EngineView:
    """What the gate reads of its engine."""

    state: State
    want_up: bool
    in_flight: int = 0  # acquire leases plus what the claims' holders report
    retry_in: float = 0.0  # failed: seconds until a request may retry it
    retired: bool = False
    closing: bool = False
    restarting: bool = False  # a reload's restart: its stop is not the load's end
    # Wanted down while its processes live (a stop, a restart's stop, of an asleep
    # engine too): the stop goes on and a request loads it after. Woken instead, an
    # asleep engine's stop was called off by the request and a restart never came.
    stopping: bool = False


@dataclass
class GateWaiter:
    """One waiting acquire (``claim`` False: it needs a slot) or claim request."""

    ticket: int
    claim: bool = False
    autoload: bool = True
    deadline: float = math.inf
    riding: bool = False  # waits for a load under way: that load's end answers it


class Answer(MachineAction):
    ticket: int
    outcome: WaitEnd


class WantUp(MachineAction):
    """Ask the engine's supervisor for the engine (a load)."""


GateAction = Answer | WantUp


class Gate:
    """One engine's line: leases need a free slot, claims do not (their frontend counts).

    ``cutoff``: while the engine yields to another engine's swap, tickets from it on
    wait, and those before it are served, so the engine goes idle and the swap happens.
    Each swap keeps its own cut (``cuts``) and the earliest is in force: a later swap's
    cut never moves an earlier one's, and the earlier one's end leaves the later in
    force (one cut for all let the second swap's end lift the first's, and the first
    lost its place).
    """

    def __init__(self) -> None:
        self.line: list[GateWaiter] = []
        self.cuts: list[int] = []

    @property
    def cutoff(self) -> int | None:
        """The cut in force: the earliest swap's, or None (not yielding)."""
        return min(self.cuts, default=None)

    def leases_waiting(self) -> int:
        return sum(not w.claim for w in self.line)

    def claims_waiting(self) -> int:
        return sum(w.claim for w in self.line)

    def waits_before(self, cutoff: int) -> bool:
        return any(w.ticket < cutoff for w in self.line)

    def may_pass(self, *, claim: bool, view: EngineView, limits: QueueLimits) -> bool:
        """Granted at once, without joining the line: nobody ahead, nothing held back."""
        return (
            view.state == READY
            and not view.closing
            and not self.line
            and self.cutoff is None
            and (claim or limits.free(view.in_flight) > 0)
        )

    def arrive(
        self, w: GateWaiter, view: EngineView, limits: QueueLimits, now: float
    ) -> list[GateAction]:
        if view.closing:
            return [Answer(w.ticket, WaitEnd.CLOSED)]
        if self.may_pass(claim=w.claim, view=view, limits=limits):
            return [Answer(w.ticket, WaitEnd.GRANTED)]
        if not w.claim and not limits.may_join(
            in_flight=view.in_flight, waiting=self.leases_waiting()
        ):
            return [Answer(w.ticket, WaitEnd.QUEUE_FULL)]
        # An asleep engine is parked like a stopped one: a request wakes it (a WantUp).
        w.riding = view.state in (STARTING, WAKING) or (
            view.state in (STOPPED, ASLEEP) and (view.want_up or view.restarting)
        )
        self.line.append(w)
        self.line.sort(key=lambda x: x.ticket)
        return self.update(view, limits, now)

    def leave(self, ticket: int) -> None:
        """A waiter that went away (cancelled, its client gone)."""
        self.line = [w for w in self.line if w.ticket != ticket]

    def hold_back(self, cutoff: int) -> bool:
        """A swap's cut from ``cutoff`` on, kept until ``release``. True if it is the one in
        force now (the earliest); a later one waits behind an earlier one's."""
        self.cuts.append(cutoff)
        return self.cutoff == cutoff

    def release(self, cutoff: int) -> None:
        """That swap ended: its cut goes, the earliest left is in force."""
        if cutoff in self.cuts:
            self.cuts.remove(cutoff)

    def update(self, view: EngineView, limits: QueueLimits, now: float) -> list[GateAction]:
        """Everything the line can decide now (call on every change of the engine,
        a lease's end, a yield's end, and at the next deadline)."""
        out: list[GateAction] = []
        keep: list[GateWaiter] = []
        for w in self.line:
            if w.deadline <= now:
                out.append(Answer(w.ticket, WaitEnd.TIMEOUT))
            else:
                keep.append(w)
        self.line = keep
        if view.closing or view.retired:
            end = WaitEnd.CLOSED if view.closing else WaitEnd.REMOVED
            out += [Answer(w.ticket, end) for w in self.line]
            self.line = []
        elif view.state == READY:
            out += self._grant(view, limits)
        elif view.state in (STOPPED, FAILED, ASLEEP) and not _coming(view):
            out += self._settle(view)
        return out

    def next_deadline(self) -> float:
        return min((w.deadline for w in self.line), default=math.inf)

    def _grant(self, view: EngineView, limits: QueueLimits) -> list[GateAction]:
        out: list[GateAction] = []
        in_flight = view.in_flight
        while self.line:
            w = self.line[0]
            if self.cutoff is not None and w.ticket >= self.cutoff:
                break
            if not w.claim and limits.free(in_flight) <= 0:
                break  # in arrival order: nobody overtakes the head
            self.line.pop(0)
            in_flight += not w.claim
            out.append(Answer(w.ticket, WaitEnd.GRANTED))
        # The load they rode ended ready: who still waits (behind a swap's cutoff, or for
        # a slot) rides nothing now. Left riding, a later stop or sleep of the engine
        # answered them with that load's end ("attempt ended") instead of loading or
        # waking it for them.
        for w in self.line:
            w.riding = False
        return out

    def _settle(self, view: EngineView) -> list[GateAction]:
        """Stopped (or failed) and nobody wants it up: each waiter's fate."""
        out: list[GateAction] = []
        keep: list[GateWaiter] = []
        launched = False
        for w in self.line:
            if w.riding:
                out.append(Answer(w.ticket, WaitEnd.ATTEMPT_ENDED))
            elif launched:
                w.riding = True
                keep.append(w)
            elif not w.autoload:
                out.append(Answer(w.ticket, WaitEnd.NOT_LOADED))
            elif view.state == FAILED and view.retry_in > 0:
                out.append(Answer(w.ticket, WaitEnd.RETRY_LATER))
            else:
                launched = True
                w.riding = True
                keep.append(w)
                out.append(WantUp())
        self.line = keep
        return out


def _coming(view: EngineView) -> bool:
    """Something under way decides the waiters' fate (a load, a restart, a stop): not
    the gate, yet."""
    return view.want_up or view.restarting or view.stopping
