"""Why a request waits, where it stands in its model's line, and when it may start (pure).

A request for a model that is asleep, loading, being pulled or busy waits from a second
to many minutes (issue 46). The frontend keeps every waiting request on a ``Board``:
its model, its key, when it came, whether it was sent to the engine. What it is
waiting for (its ``WaitPhase``), its place in the model's line and an ETA are decided here
from the board and a look at the engine (``EngineLook``: the daemon's status of it);
``ktd/frontend/waits.py`` carries the answers out (a stream's progress events, the
status route, the dashboard, the report to the daemon).

Positions are this frontend's line for the model, in arrival order: 1 is next. A
key's ``priority`` may let a later request be served first (the desk's rule,
``ktd.core.admission``); the positions then close up as they always do, when one
leaves. The ETA is an estimate, never a promise: a load's from the load history (the
median of the model's last loads, ``ktd/daemon/pool/loadhistory.py``) or, without one, from
the engine's own percentage; a wake's from the wakes this frontend saw; a place in the
line from the time requests on the model held their slot (an average, per slot of
``max_concurrent``); prefill from the model's recent times to first token.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ktd.core import states as S

__all__ = ["Board", "EngineLook", "Progress", "Rates", "WaitPhase", "Waiter", "decide"]


class WaitPhase(StrEnum):
    """What a waiting request waits for (open vocabulary: clients ignore an unknown one)."""

    QUEUED = "queued"  # in the model's line here: behind others, or until its claim comes
    ROOM = "room"  # its engine waits for room: other engines to go idle (a swap)
    PULLING = "pulling"  # the model's weights are being fetched (pull jobs)
    LOADING = "loading"  # its engine is starting
    WAKING = "waking"  # its engine is asleep or waking
    PREFILL = "prefill"  # sent to the engine, no first token yet


#: The daemon's load step that means the weights are being fetched (the pull jobs).
PULL_STEP = "pulling"
#: Load steps in which the engine waits for room (``ktd.core.states.Step``).
ROOM_STEPS = frozenset({"waiting", "making_room"})
_WAKES = frozenset({S.ASLEEP, S.SLEEPING, S.WAKING})
_LOADS = frozenset({S.STARTING, S.STOPPED, S.FAILED, S.STOPPING, S.DRAINING})
#: How many of a model's last wakes make its wake estimate.
KEEP_WAKES = 5
#: Weight of the newest sample in the running averages.
ALPHA = 0.3


@dataclass(frozen=True)
class EngineLook:
    """What the daemon says of a model's engine, as far as a wait needs it."""

    state: str
    step: str | None = None
    waiting_for: tuple[str, ...] = ()
    phase: str | None = None  # the engine's own phase, as text ("loading weights")
    percent: float | None = None  # how far its log says the load is (0-100)
    elapsed: float | None = None  # seconds since this load (or wake) began
    load_eta: float | None = None  # seconds its loads took (the load history's median)
    in_flight: int = 0
    max_concurrent: int | None = None


@dataclass
class Rates:
    """One model's measured times on this frontend."""

    service: float | None = None  # seconds a request holds its slot (running average)
    first_token: float | None = None  # seconds from sending to the first token
    wakes: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP_WAKES))

    @staticmethod
    def _mix(old: float | None, new: float) -> float:
        return new if old is None else (1 - ALPHA) * old + ALPHA * new

    def served(self, seconds: float) -> None:
        self.service = self._mix(self.service, max(0.0, seconds))

    def first(self, seconds: float) -> None:
        self.first_token = self._mix(self.first_token, max(0.0, seconds))

    def woke(self, seconds: float) -> None:
        self.wakes.append(max(0.0, seconds))

    def wake(self) -> float | None:
        return statistics.median(self.wakes) if self.wakes else None


@dataclass
class Waiter:
    """One request on the board."""

    rid: int
    model: str
    since: float
    key: str = ""
    request_id: str | None = None  # the client's X-Request-Id
    sent: float | None = None  # when it went to the engine (phase prefill)


@dataclass(frozen=True)
class Progress:
    """What one waiting request is told."""

    phase: WaitPhase
    model: str
    position: int  # 1 is next; 0 once sent to the engine
    queued: int  # requests waiting in the model's line here
    waited: float  # seconds since it came
    eta: float | None = None  # seconds until it may start (its first token, in prefill)
    detail: str = ""  # the engine's own phase, or the engines a swap waits for
    percent: float | None = None
    waiting_for: tuple[str, ...] = ()

    @property
    def ahead(self) -> int:
        return max(0, self.position - 1)

    def doc(self) -> dict[str, Any]:
        """As JSON: the body of a ``ktd.progress`` event and of the status route."""
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "model": self.model,
            "position": self.position,
            "ahead": self.ahead,
            "queued": self.queued,
            "waited": round(self.waited, 1),
            "eta": None if self.eta is None else round(self.eta, 1),
        }
        if self.detail:
            out["detail"] = self.detail
        if self.percent is not None:
            out["percent"] = round(self.percent)
        if self.waiting_for:
            out["waiting_for"] = list(self.waiting_for)
        return out

    def key(self) -> tuple[object, ...]:
        """What makes a new event worth sending: its phase first. Time alone does not,
        nor do arrivals behind it (``queued``): a burst would tell every waiter of each."""
        pct = None if self.percent is None else int(self.percent)
        return (self.phase, self.position, self.detail, pct, self.waiting_for)

    def text(self) -> str:
        """For people: what a chat UI shows as reasoning (``X-Ktd-Progress: reasoning``)."""
        model = "".join(ch for ch in self.model if ch.isprintable())
        if self.phase == WaitPhase.QUEUED:
            what = f"queued for {model}: {self.ahead} request(s) ahead"
        elif self.phase == WaitPhase.ROOM:
            names = ", ".join(self.waiting_for) or "other engines"
            what = f"{model} waits for room: {names} to go idle"
        elif self.phase == WaitPhase.PULLING:
            what = f"pulling {model}"
        elif self.phase == WaitPhase.LOADING:
            what = f"loading {model}" + (f" ({self.detail})" if self.detail else "")
        elif self.phase == WaitPhase.WAKING:
            what = f"waking {model}"
        else:
            what = f"{model} is reading the prompt"
        if self.percent is not None:
            what += f", {int(self.percent)}%"
        what += f", {int(self.waited)}s so far"
        if self.eta is not None:
            what += f", ~{math.ceil(self.eta)}s to go"
        return what


def _queue_eta(ahead_of_it: int, look: EngineLook | None, rates: Rates) -> float | None:
    """Seconds until the slots free up for a request with ``ahead_of_it`` waiters before
    it: each slot of ``max_concurrent`` frees one request per ``service`` seconds."""
    if look is None or look.max_concurrent is None:
        return 0.0  # no limit: it goes the moment its engine is up
    free = max(0, look.max_concurrent - look.in_flight)
    behind = ahead_of_it + 1 - free  # slots that must free up before its turn
    if behind <= 0:
        return 0.0
    if rates.service is None:
        return None
    return behind * rates.service / look.max_concurrent


def _remaining(total: float | None, elapsed: float | None) -> float | None:
    if total is None:
        return None
    return max(0.0, total - (elapsed or 0.0))


def decide(
    waiter: Waiter,
    position: int,
    queued: int,
    look: EngineLook | None,
    rates: Rates,
    now: float,
    *,
    wake_began: float | None = None,
) -> Progress:
    """The phase, position and ETA of one request. ``look`` None: the engine is not known
    yet (the request just came, the daemon was not asked): it is in the model's line.
    ``wake_began``: when this frontend first saw the model asleep or waking."""
    waited = max(0.0, now - waiter.since)
    base: dict[str, Any] = {
        "model": waiter.model,
        "position": position,
        "queued": queued,
        "waited": waited,
    }
    if waiter.sent is not None:
        eta = _remaining(rates.first_token, now - waiter.sent)
        return Progress(WaitPhase.PREFILL, **{**base, "position": 0}, eta=eta)
    if look is None:
        return Progress(WaitPhase.QUEUED, **base)
    if look.step in ROOM_STEPS or (look.waiting_for and look.state in (S.STARTING, S.WAKING)):
        return Progress(
            WaitPhase.ROOM, **base, waiting_for=look.waiting_for, detail=look.phase or ""
        )
    queue = _queue_eta(position - 1, EngineLook(S.READY, max_concurrent=look.max_concurrent), rates)
    if look.state == S.STARTING and look.step == PULL_STEP:
        return Progress(
            WaitPhase.PULLING, **base, percent=look.percent, detail=look.phase or "", eta=None
        )
    if look.state in _WAKES:
        since = None if wake_began is None else now - wake_began
        eta = _plus(_remaining(rates.wake(), since), queue)
        return Progress(WaitPhase.WAKING, **base, eta=eta, detail=look.phase or "")
    if look.state in _LOADS:
        eta = _plus(_load_left(look), queue)
        return Progress(
            WaitPhase.LOADING, **base, eta=eta, percent=look.percent, detail=look.phase or ""
        )
    eta = _queue_eta(position - 1, look, rates)
    return Progress(WaitPhase.QUEUED, **base, eta=eta)


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _load_left(look: EngineLook) -> float | None:
    """A load's time left: its history's median less its age; without a history, its
    age scaled by the percentage its log gives."""
    if look.state != S.STARTING or look.elapsed is None:
        return look.load_eta  # not started yet (stopped, failed, going down): a whole load
    left = _remaining(look.load_eta, look.elapsed)
    if left is not None:
        return left
    if look.percent is not None and 0 < look.percent < 100:
        return look.elapsed * (100 - look.percent) / look.percent
    return None


class Board:
    """Every request waiting at this frontend, in its model's line, and the models'
    measured times. ``arrive`` puts a request at the end of its model's line;
    ``sent`` takes it out of the line (prefill); ``first_token`` and ``leave`` take it
    off the board. Those behind one that left move up by one."""

    def __init__(self) -> None:
        self.waiters: dict[int, Waiter] = {}
        self.lines: dict[str, list[int]] = {}  # model -> rids not yet sent, arrival order
        self.rates: dict[str, Rates] = {}
        self.wake_began: dict[str, float] = {}  # model -> first seen asleep/waking

    # ------------------------------------------------------------ events

    def arrive(
        self, rid: int, model: str, now: float, *, key: str = "", request_id: str | None = None
    ) -> Waiter:
        """A request that must wait (again, after a stale claim: at the end of the line)."""
        old = self.waiters.get(rid)
        if old is not None:
            self._out_of_line(old)
        waiter = Waiter(rid, model, now if old is None else old.since, key, request_id)
        self.waiters[rid] = waiter
        self.lines.setdefault(model, []).append(rid)
        return waiter

    def sent(self, rid: int, now: float) -> None:
        """Its slot came and it went to the engine: out of the line, in prefill."""
        waiter = self.waiters.get(rid)
        if waiter is None or waiter.sent is not None:
            return
        self._out_of_line(waiter)
        waiter.sent = now
        began = self.wake_began.pop(waiter.model, None)
        if began is not None:
            self.rates_of(waiter.model).woke(now - began)

    def first_token(self, rid: int, now: float) -> None:
        """Its answer began: off the board; its time to first token counted."""
        waiter = self.waiters.pop(rid, None)
        if waiter is None:
            return
        self._out_of_line(waiter)
        if waiter.sent is not None:
            self.rates_of(waiter.model).first(now - waiter.sent)

    def leave(self, rid: int) -> Waiter | None:
        """It ended or its client went away: off the board at once."""
        waiter = self.waiters.pop(rid, None)
        if waiter is not None:
            self._out_of_line(waiter)
            if not self.lines.get(waiter.model) and not self._sent_for(waiter.model):
                self.wake_began.pop(waiter.model, None)  # nobody left to see the wake end
        return waiter

    def served(self, model: str, seconds: float) -> None:
        """A request held its slot on ``model`` for ``seconds``."""
        self.rates_of(model).served(seconds)

    def saw(self, model: str, look: EngineLook, now: float) -> None:
        """A look at the model's engine while requests wait for it: a wake is timed from
        the first look that shows it asleep or waking."""
        if look.state in _WAKES:
            began = now - (look.elapsed or 0.0) if look.state == S.WAKING else now
            self.wake_began.setdefault(model, began)
        elif look.state != S.READY:
            self.wake_began.pop(model, None)

    # ------------------------------------------------------------ queries

    def rates_of(self, model: str) -> Rates:
        found = self.rates.get(model)
        if found is None:
            found = self.rates[model] = Rates()
        return found

    def position(self, rid: int) -> int:
        """1-based place in its model's line; 0 once sent (or unknown)."""
        waiter = self.waiters.get(rid)
        if waiter is None or waiter.sent is not None:
            return 0
        return self.lines[waiter.model].index(rid) + 1

    def line(self, model: str) -> list[int]:
        return list(self.lines.get(model, ()))

    def progress(self, rid: int, look: EngineLook | None, now: float) -> Progress | None:
        waiter = self.waiters.get(rid)
        if waiter is None:
            return None
        return decide(
            waiter,
            self.position(rid),
            len(self.lines.get(waiter.model, ())),
            look,
            self.rates_of(waiter.model),
            now,
            wake_began=self.wake_began.get(waiter.model),
        )

    def models(self) -> list[str]:
        """Models with a request on the board."""
        return sorted({w.model for w in self.waiters.values()})

    def oldest(self, now: float) -> dict[str, float]:
        """Per model with requests in line: how long its oldest one has waited."""
        out: dict[str, float] = {}
        for model, rids in self.lines.items():
            if rids:
                out[model] = max(0.0, now - min(self.waiters[r].since for r in rids))
        return out

    # ------------------------------------------------------------ inside

    def _out_of_line(self, waiter: Waiter) -> None:
        rids = self.lines.get(waiter.model)
        if rids is not None and waiter.rid in rids:
            rids.remove(waiter.rid)
            if not rids:
                del self.lines[waiter.model]

    def _sent_for(self, model: str) -> bool:
        return any(w.model == model and w.sent is not None for w in self.waiters.values())
