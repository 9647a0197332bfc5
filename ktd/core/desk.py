"""Admission on the frontend (pure; ``ktd.core.admission`` has the rules): the ``Desk``
admits the frontend's requests onto the standing claims it holds, asks for a claim when
it has none, and decides what a recall, a request's end or a lost daemon means.
``ktd.frontend.broker`` carries out its actions.

At the desk a request also carries its API key's terms (``KeyTerms``, from the
config's ``frontend.keys``): a key past its ``max_concurrent`` (requests of that key
waiting or in flight at this frontend) is refused at once (its ``tokens_per_day`` is
reserved before the desk: ``ktd.core.budget``); and a line is served by ``priority``
(higher first, arrival order within a level), except that a request overtaken
``OVERTAKE_LIMIT`` times by later arrivals goes next, so a low priority waits
behind a bounded number of others, never for ever.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ktd.core.action import MachineAction
from ktd.core.limits import QueueLimits

__all__ = [
    "ANYONE",
    "OVERTAKE_LIMIT",
    "Ask",
    "ClaimGrant",
    "Desk",
    "DeskAction",
    "Fetch",
    "GiveBack",
    "Grant",
    "Held",
    "KeyBusy",
    "KeyTerms",
    "KeyUse",
    "Line",
    "QueueFull",
    "Refuse",
    "Tell",
    "Timeout",
]


@dataclass(frozen=True)
class ClaimGrant:
    """A claim as the daemon granted it (``ClaimReply``'s fields the desk needs)."""

    claim: str
    alias: str
    url: str
    limits: QueueLimits = QueueLimits()  # noqa: RUF009  (frozen: one shared default is safe)


@dataclass
class Held:
    """A standing claim held here: where its engine is and how busy it is."""

    id: str
    alias: str
    url: str
    last_end: float
    in_flight: int = 0
    routing: bool = True
    return_when_idle: bool = False  # an ``idle 0`` recall: give back when next idle


@dataclass
class Line:
    """One model name at this frontend: its claim, the claim being asked for, who waits."""

    model: str
    held: Held | None = None
    fetching: bool = False
    waiting: deque[int] = field(default_factory=deque)  # request ids, in arrival order
    limits: QueueLimits = QueueLimits()  # noqa: RUF009  (frozen: one shared default is safe)

    def has_slot(self) -> bool:
        held = self.held
        return held is not None and held.routing and self.limits.free(held.in_flight) > 0

    def in_flight(self) -> int:
        held = self.held
        return held.in_flight if held is not None and held.routing else 0


@dataclass(frozen=True)
class KeyTerms:
    """What a request's API key asks of the desk (``name`` "": no key, no limits)."""

    name: str = ""
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    priority: int = 0


ANYONE = KeyTerms()

#: How many later arrivals may be served ahead of a waiting request (by priority)
#: before it goes next whatever its priority.
OVERTAKE_LIMIT = 16


@dataclass
class KeyUse:
    """One key's use at this desk."""

    active: int = 0  # its requests here, waiting or in flight


@dataclass
class Ask:
    """One request at the desk."""

    rid: int
    model: str
    deadline: float
    autoload: bool
    load_timeout: float  # 0: none (what the Claim asks the daemon to wait)
    key: KeyTerms = ANYONE
    overtaken: int = 0  # later arrivals served ahead of it (by priority)
    slot: Held | None = None
    done: bool = False  # answered (granted or refused) or gone


class Grant(MachineAction):
    rid: int
    held: Held
    key: str = ""  # the request's key: its end is ``ended(held, now, key)``


class Refuse(MachineAction):
    """``reason`` is the desk's own (``queue_full``, ``timeout``) or the daemon's error."""

    rid: int
    reason: object


class Fetch(MachineAction):
    """Send one ``Claim`` for ``model`` on the first waiter's terms."""

    model: str
    autoload: bool
    timeout: float  # 0: none
    asked: tuple[int, ...]  # the requests it answers if it times out


class GiveBack(MachineAction):
    """Send ``Return`` for the claim (no longer routed here)."""

    claim: str


class Tell(MachineAction):
    """Something the daemon should hear soon: a claim turned busy or idle, the queue."""


DeskAction = Grant | Refuse | Fetch | GiveBack | Tell


class QueueFull(Exception):
    def __init__(self, message: str, waiting: int) -> None:
        super().__init__(message)
        self.waiting = waiting


class Timeout(Exception):
    pass


class KeyBusy(Exception):
    """The key has ``max_concurrent`` requests here already."""

    def __init__(self, key: str, limit: int) -> None:
        super().__init__(f"key {key!r} has {limit} request(s) under way (its max_concurrent)")
        self.key = key
        self.limit = limit


def _key_refusal(key: KeyTerms, use: KeyUse) -> Exception | None:
    """Why ``key`` may not start another request now, if it may not."""
    if key.max_concurrent is not None and use.active >= key.max_concurrent:
        return KeyBusy(key.name, key.max_concurrent)
    return None


class Desk:
    """Every model line and claim of one frontend."""

    def __init__(self, *, overtake_limit: int = OVERTAKE_LIMIT) -> None:
        self.overtake_limit = overtake_limit
        self.lines: dict[str, Line] = {}
        self.claims: dict[str, Held] = {}
        self.asks: dict[int, Ask] = {}
        self.keys: dict[str, KeyUse] = {}
        self.limits_known = False  # the daemon's limits heard (first report's reply)
        self._rids = 0

    # ------------------------------------------------------------ queries

    def line(self, model: str) -> Line:
        found = self.lines.get(model)
        if found is None:
            found = self.lines[model] = Line(model)
        return found

    def queued(self) -> dict[str, int]:
        return {m: len(line.waiting) for m, line in self.lines.items() if line.waiting}

    def routed(self) -> list[str]:
        return sorted({h.alias for h in self.claims.values() if h.routing})

    def needs_daemon(self, model: str) -> bool:
        """A request for ``model`` now cannot be served on a claim held here."""
        line = self.lines.get(model)
        return line is None or line.held is None or not line.held.routing

    def next_deadline(self) -> float:
        return min((a.deadline for a in self.asks.values() if not a.done), default=math.inf)

    # ------------------------------------------------------------ requests

    def arrive(
        self,
        model: str,
        now: float,
        *,
        autoload: bool = True,
        load_timeout: float = 0.0,
        key: KeyTerms = ANYONE,
    ) -> tuple[int, list[DeskAction]]:
        """A new request: granted at once, refused (its key's limits, queue full), or in
        line. Every request admitted here ends with ``ended`` (granted) or ``leave``."""
        self._rids += 1
        rid = self._rids
        use = self.keys.get(key.name)
        if use is None:
            use = self.keys[key.name] = KeyUse()
        refused = _key_refusal(key, use)
        if refused is not None:
            return rid, [Refuse(rid, refused)]
        line = self.line(model)
        if not line.waiting and line.has_slot():
            # The fast path (a held claim, a free slot, nobody ahead): no Ask to keep.
            assert line.held is not None
            use.active += 1
            return rid, self._occupy(rid, line.held, key.name)
        deadline = now + load_timeout if load_timeout > 0 else math.inf
        ask = Ask(rid, model, deadline, autoload, load_timeout, key)
        if not line.limits.may_join(in_flight=line.in_flight(), waiting=len(line.waiting)):
            message = line.limits.full_message(len(line.waiting))
            return rid, [Refuse(rid, QueueFull(message, len(line.waiting)))]
        use.active += 1
        self.asks[rid] = ask
        line.waiting.append(rid)
        return rid, [Tell(), *self._serve(line)]

    def leave(self, rid: int) -> list[DeskAction]:
        """A request gave up (client gone, or it took an answer): out of line."""
        ask = self.asks.pop(rid, None)
        if ask is None or ask.done:
            return []
        ask.done = True
        self._inactive(ask.key.name)
        line = self.lines[ask.model]
        if rid in line.waiting:
            line.waiting.remove(rid)
        return [Tell()]

    def ended(self, held: Held, now: float, key: str = "") -> list[DeskAction]:
        """A request of ``key`` on ``held`` ended: the next waiter in, or the claim back
        if due."""
        self._inactive(key)
        held.in_flight -= 1
        if held.in_flight:
            return self._serve_claim(held)
        held.last_end = now
        if not held.routing or held.return_when_idle:
            return [Tell(), *self._give_back(held)]
        return [Tell(), *self._serve_claim(held)]

    def tick(self, now: float) -> list[DeskAction]:
        """Requests whose ``load_timeout`` ran out are refused."""
        out: list[DeskAction] = []
        for ask in list(self.asks.values()):
            if not ask.done and ask.slot is None and ask.deadline <= now:
                out += self.leave(ask.rid)
                out.append(Refuse(ask.rid, Timeout(ask.model)))
        return out

    # ------------------------------------------------------------ the daemon's answers

    def granted(self, model: str, grant: ClaimGrant, now: float) -> list[DeskAction]:
        line = self.line(model)
        line.fetching = False
        held = self.claims.get(grant.claim)
        if held is None:
            held = self.claims[grant.claim] = Held(grant.claim, grant.alias, grant.url, now)
        line.held = held
        line.limits = grant.limits
        return [Tell(), *self._serve(line)]

    def fetch_failed(
        self, model: str, reason: object, *, only: Iterable[int] | None = None
    ) -> list[DeskAction]:
        """The Claim failed: its waiters (or only ``only``, a timeout) are refused; any
        left ask again on their own terms."""
        line = self.line(model)
        line.fetching = False
        failing = list(line.waiting) if only is None else [r for r in only if r in line.waiting]
        out: list[DeskAction] = []
        for rid in failing:
            out += self.leave(rid)
            out.append(Refuse(rid, reason))
        return out + self._serve(line)

    def daemon_lost(self, reason: object) -> list[DeskAction]:
        """The daemon stopped answering: requests waiting for it are refused now. Held
        claims keep serving (the engines still run)."""
        out: list[DeskAction] = []
        for line in self.lines.values():
            if line.fetching:
                out += self.fetch_failed(line.model, reason)
        return out

    def limits(self, limits: dict[str, QueueLimits]) -> list[DeskAction]:
        """The daemon's current limits for every model (absent: none); a raised limit
        lets waiters in at once."""
        self.limits_known = True
        out: list[DeskAction] = []
        for model, line in self.lines.items():
            line.limits = limits.get(model, QueueLimits())
            out += self._serve(line)
        return out

    def dropped(self, claim: str) -> list[DeskAction]:
        """The daemon does not hold this claim for us: stop using it, nothing to return."""
        held = self.claims.pop(claim, None)
        return [] if held is None else self._stop_routing(held)

    def recall(self, claim: str, *, drain: bool, idle: float, now: float) -> list[DeskAction]:
        held = self.claims.get(claim)
        if held is None:
            return [GiveBack(claim)]  # not ours (any more): say so, or it keeps asking
        quiet = held.in_flight == 0 and now - held.last_end >= idle
        if drain:
            return self._give_back(held) if held.in_flight == 0 else self._stop_routing(held)
        if quiet:
            return self._give_back(held)
        if idle <= 0:
            held.return_when_idle = True
            return []
        return [Tell()]  # busier than asked: the report answers the recall

    def give_back_all(self) -> list[DeskAction]:
        """Shutting down: nothing new is routed; idle claims go back now, busy ones at
        their last request's end."""
        out: list[DeskAction] = []
        for held in list(self.claims.values()):
            out += self._give_back(held) if held.in_flight == 0 else self._stop_routing(held)
        return out

    # ------------------------------------------------------------ inside

    def _inactive(self, key: str) -> None:
        use = self.keys[key]
        use.active -= 1
        if not use.active:
            del self.keys[key]  # nothing to remember: no request here

    def _give_slot(self, ask: Ask, held: Held) -> list[DeskAction]:
        ask.slot = held
        ask.done = True
        self.asks.pop(ask.rid, None)
        return self._occupy(ask.rid, held, ask.key.name)

    @staticmethod
    def _occupy(rid: int, held: Held, key: str) -> list[DeskAction]:
        """Request ``rid`` on ``held``: its grant, and a report when the claim turns busy."""
        held.in_flight += 1
        if held.in_flight == 1:
            return [Grant(rid, held, key), Tell()]
        return [Grant(rid, held, key)]

    def _serve(self, line: Line) -> list[DeskAction]:
        """Free slots to waiters in arrival order; a claim asked for if there is none."""
        out: list[DeskAction] = []
        while line.waiting:
            held = line.held
            if held is None or not held.routing:
                if not line.fetching:
                    line.fetching = True
                    first = self.asks[self._next(line, overtake=False)]
                    out.append(
                        Fetch(line.model, first.autoload, first.load_timeout, tuple(line.waiting))
                    )
                break
            if not line.has_slot():
                break
            ask = self.asks[self._next(line)]
            line.waiting.remove(ask.rid)
            out += self._give_slot(ask, held)
        return out

    def _next(self, line: Line, *, overtake: bool = True) -> int:
        """The waiter served next: the earliest overtaken ``overtake_limit`` times, else
        the earliest of the highest priority; those it overtakes count it."""
        chosen = line.waiting[0]
        best = self.asks[chosen].key.priority
        for rid in line.waiting:
            ask = self.asks[rid]
            if ask.overtaken >= self.overtake_limit:
                chosen = rid
                break
            if ask.key.priority > best:
                chosen, best = rid, ask.key.priority
        if overtake and chosen != line.waiting[0]:
            for rid in line.waiting:
                if rid == chosen:
                    break
                self.asks[rid].overtaken += 1
        return chosen

    def _serve_claim(self, held: Held) -> list[DeskAction]:
        out: list[DeskAction] = []
        for line in self.lines.values():
            if line.held is held:
                out += self._serve(line)
        return out

    def _stop_routing(self, held: Held) -> list[DeskAction]:
        held.routing = False
        out: list[DeskAction] = [Tell()]
        for line in self.lines.values():
            if line.held is held:
                line.held = None
                out += self._serve(line)  # its waiters ask the daemon for a new claim
        return out

    def _give_back(self, held: Held) -> list[DeskAction]:
        if self.claims.pop(held.id, None) is None:
            return []
        return [*self._stop_routing(held), GiveBack(held.id)]
