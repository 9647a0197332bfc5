"""Waiting requests, carried out: the board (``ktd.core.waiting``) fed from the request
flow and the daemon's status, and what a waiting client is told (issue 46).

Each proxied request gets a ``Ticket`` (``Exchange.watch``). A request that has to wait
for its slot goes on the board (``arrived``); its slot takes it out of the model's line
(``sent``: prefill), its first byte or its end off the board. While anything waits, one
task asks the daemon for every engine's status every ``refresh`` seconds (one
``Status`` for all, however many wait), and after each look or change of the board
works out each waiter's progress and pokes the streams whose progress moved: they send
an event then, not at their next comment (a new phase at once; a new place in the line
or percentage at most every ``EVENT_GAP``, so that the head of a long line leaving does
not cost an event per waiter per grant). The cost is one pass over the waiters per
change, at most every ``PASS_GAP``, never one per waiter per change.

What a stream carries, by API (each checked against the official clients, Python and
Node: README, "Waiting requests know why"):

* OpenAI's chat and completions: ``event: ktd.progress`` with an empty chunk for data
  (``choices: []``, as OpenAI's own usage chunk) and the progress in ``ktd_progress``.
  OpenAI's SDKs hand every ``data:`` to the caller whatever its ``event:`` name, so the
  body must be a chunk a caller already handles. With ``X-Ktd-Progress: reasoning``
  (or the key's ``progress: "reasoning"``) the chunk's one choice has the progress as
  its ``delta.reasoning_content``: what chat UIs show as thinking, never ``content``.
* Anthropic's Messages: ``event: ping`` with ``{"type": "ping", "ktd_progress": ...}``:
  the SDKs skip ``ping``; any other event before ``message_start`` makes their stream
  helpers raise.
* Others (Responses, SGLang's native routes): comments only. OpenAI's Responses stream
  helper raises on any event before ``response.created``.
* Ollama's NDJSON: nothing; its answer waits (its status is the real one), as Ollama's.

Requests that are not streamed are looked up by their ``X-Request-Id``
(``GET /v1/ktd/requests/{id}``) or listed (``GET /v1/ktd/requests``; waitroutes.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.waiting import Board, EngineLook, Progress, WaitPhase
from ktd.frontend.broker import ClaimBroker
from ktd.frontend.metrics import Metrics

log = logging.getLogger("ktd.frontend")

#: The request header that asks for progress as reasoning deltas (or ``off``).
PROGRESS_HEADER = b"x-ktd-progress"
REQUEST_ID_HEADER = b"x-request-id"
#: Progress modes: events only, or also as ``reasoning_content`` deltas.
MODES = ("events", "reasoning")
_MAX_ID = 200  # the status route's ids: routes.py's ``_ID``
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
#: At most one pass over the waiting requests per this many seconds (a burst: one pass).
PASS_GAP = 0.1
#: A stream is told of a new place in the line at most this often (a new phase: at once).
EVENT_GAP = 1.0


def look_of(info: p.EngineInfo, now_wall: float) -> EngineLook:
    """The daemon's status of an engine, as far as a wait needs it."""
    elapsed = None
    if info.state == S.STARTING and info.load_started:
        elapsed = max(0.0, now_wall - info.load_started)
    elif info.since:
        elapsed = max(0.0, now_wall - info.since)
    return EngineLook(
        state=str(info.state),
        step=info.step,
        waiting_for=tuple(info.waiting_for),
        phase=info.phase,
        percent=info.load_percent,
        elapsed=elapsed,
        load_eta=info.load_eta,
        in_flight=info.in_flight,
        max_concurrent=info.max_concurrent,
    )


@dataclass
class Ticket:
    """One proxied request's place on the board, and what its stream was last told."""

    waits: Waits
    rid: int
    model: str
    key: str
    endpoint: str
    request_id: str | None
    reasoning: bool
    stream: bool = False
    on_board: bool = False
    shown: tuple[object, ...] | None = None  # the progress key last sent
    poke_scope: trio.CancelScope | None = None  # the stream's wait, cut short on a change
    phase: WaitPhase | None = None  # the phase it is in (timed for the metrics)
    phase_since: float = 0.0
    sent_at: float | None = None
    told: float = -math.inf  # when its stream was last sent an event

    # ------------------------------------------------------------ the flow's events

    def arrived(self) -> None:
        """It has to wait for its slot (again, after a stale claim)."""
        self.waits.arrive(self)

    def sent(self) -> None:
        self.sent_at = trio.current_time()
        if self.on_board:
            self.waits.board.sent(self.rid, self.sent_at)
            self.waits.nudge()
            self._enter(WaitPhase.PREFILL, self.sent_at)

    def first_token(self) -> None:
        now = trio.current_time()
        if self.on_board:
            self.waits.board.first_token(self.rid, now)
            self.waits.off(self)
        self._enter(None, now)  # the wait is over

    def closed(self, label: str) -> None:
        """The request ended: off the board, its slot's time counted, its phases timed."""
        now = trio.current_time()
        if self.sent_at is not None:
            self.waits.board.served(self.model, now - self.sent_at)
        if self.on_board:
            self.waits.board.leave(self.rid)
            self.waits.off(self)
        self._enter(None, now)
        for phase, seconds in self.waits.timed.pop(self.rid, {}).items():
            self.waits.metrics.phase_waited(label, phase, seconds)

    # ------------------------------------------------------------ what it is told

    def progress(self, *, known: bool = True) -> Progress | None:
        """Its progress now; ``known`` False: from the board alone (the first event,
        before the daemon was asked: its place in the model's line)."""
        look = self.waits.looks.get(self.model) if known else None
        found = self.waits.board.progress(self.rid, look, trio.current_time())
        if found is not None:
            self._enter(found.phase, trio.current_time())
        return found

    def event(self, *, force: bool = False, first: bool = False) -> bytes:
        """The stream's progress event if it changed (or ``force``), in its API's form."""
        if not self.stream:
            return b""
        found = self.progress(known=not first)
        if found is None or (not force and found.key() == self.shown):
            return b""
        self.shown = found.key()
        self.told = trio.current_time()
        return sse_event(self.endpoint, found, self.model, reasoning=self.reasoning)

    def poke(self) -> None:
        if self.poke_scope is not None:
            self.poke_scope.cancel()

    def _enter(self, phase: WaitPhase | None, now: float) -> None:
        if phase == self.phase:
            return
        if self.phase is not None:
            spent = self.waits.timed.setdefault(self.rid, {})
            spent[self.phase] = spent.get(self.phase, 0.0) + max(0.0, now - self.phase_since)
        self.phase, self.phase_since = phase, now


def sse_event(endpoint: str, progress: Progress, model: str, *, reasoning: bool) -> bytes:
    """One progress event in the form the route's official clients pass over safely."""
    doc = progress.doc()
    if endpoint in ("chat", "completions"):
        chunk: dict[str, Any] = {
            "id": "ktd-progress",
            "object": "chat.completion.chunk" if endpoint == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "ktd_progress": doc,
        }
        if reasoning and endpoint == "chat":
            delta = {"role": "assistant", "reasoning_content": progress.text() + "\n"}
            chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
        body = json.dumps(chunk, separators=(",", ":"))
        return f"event: ktd.progress\ndata: {body}\n\n".encode()
    if endpoint == "messages":
        body = json.dumps({"type": "ping", "ktd_progress": doc}, separators=(",", ":"))
        return f"event: ping\ndata: {body}\n\n".encode()
    return b""


def _mode(value: bytes | None, default: str | None) -> bool:
    """Whether progress goes out as reasoning too: the header wins, then the key's."""
    if value is not None:
        return value.strip().lower() == b"reasoning"
    return default == "reasoning"


def request_id_of(value: bytes | None) -> str | None:
    """The client's ``X-Request-Id``, if it is one the status route can name."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    if not text or len(text) > _MAX_ID or not all(c in _ID_CHARS for c in text):
        return None
    return text


class Waits:
    """The board and its tickets, the engines' looks, and the task that keeps them fresh."""

    def __init__(
        self,
        broker: ClaimBroker,
        metrics: Metrics,
        *,
        key_modes: Mapping[str, str] | None = None,
        refresh: float = 0.5,
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self.key_modes = dict(key_modes or {})  # key name -> its progress mode
        self.refresh = refresh
        self.board = Board()
        self.tickets: dict[int, Ticket] = {}  # rid -> on the board
        self.looks: dict[str, EngineLook] = {}  # model -> its engine, while anything waits
        self.timed: dict[int, dict[WaitPhase, float]] = {}  # rid -> seconds per phase
        self._rids = itertools.count(1)
        self._nudge = trio.Event()

    def ticket(
        self,
        model: str,
        key: str,
        endpoint: str,
        headers: Iterable[tuple[bytes, bytes]],
        *,
        stream: bool,
    ) -> Ticket:
        """A request's ticket (it goes on the board only if it has to wait)."""
        request = wanted = None
        for name, value in headers:
            if name == REQUEST_ID_HEADER:
                request = value
            elif name == PROGRESS_HEADER:
                wanted = value
        return Ticket(
            self,
            next(self._rids),
            model,
            key,
            endpoint,
            request_id_of(request),
            _mode(wanted, self.key_modes.get(key)),
            stream=stream,
        )

    def arrive(self, ticket: Ticket) -> None:
        now = trio.current_time()
        self.board.arrive(
            ticket.rid, ticket.model, now, key=ticket.key, request_id=ticket.request_id
        )
        ticket.on_board = True
        ticket.sent_at = None
        self.tickets[ticket.rid] = ticket
        ticket.progress(known=False)
        self.nudge()

    def off(self, ticket: Ticket) -> None:
        ticket.on_board = False
        if self.tickets.pop(ticket.rid, None) is not None:
            self.nudge()

    def nudge(self) -> None:
        """The board changed: the refresh task tells the streams whose progress moved
        (soon, and once for a burst of changes: ``PASS_GAP``)."""
        self._nudge.set()

    # ------------------------------------------------------------ queries

    def oldest(self) -> dict[str, float]:
        """Per model: how long the oldest request in its line here has waited (the
        report to the daemon: ``ktctl status``)."""
        return self.board.oldest(trio.current_time())

    def listing(self, *, key: str | None) -> list[dict[str, Any]]:
        """Every waiting request (``key`` None: an admin's view), or one key's only."""
        out = []
        for t in list(self.tickets.values()):
            if key is not None and t.key != key:
                continue
            doc = self.describe(t)
            if doc is not None:
                out.append(doc)
        return out

    def find(self, request_id: str, *, key: str | None) -> dict[str, Any] | None:
        for t in list(self.tickets.values()):
            if t.request_id == request_id and (key is None or t.key == key):
                return self.describe(t)
        return None

    def describe(self, t: Ticket) -> dict[str, Any] | None:
        found = t.progress()
        if found is None:
            return None
        return {"request_id": t.request_id, "key": t.key, "stream": t.stream, **found.doc()}

    # ------------------------------------------------------------ the refresh task

    async def run(self) -> None:
        """While anything waits: the engines' status every ``refresh`` seconds, and after
        each look or change of the board the streams whose progress moved told (at most
        one pass per ``PASS_GAP``: a burst of arrivals or grants costs one pass)."""
        next_look = -math.inf
        while True:
            if not self.tickets:
                self.looks.clear()
                self._nudge = trio.Event()
                await self._nudge.wait()
            if trio.current_time() >= next_look:
                await self.look_once()
                next_look = trio.current_time() + self.refresh
            self._nudge = trio.Event()
            self.tell(trio.current_time())
            with trio.move_on_at(next_look):
                await self._nudge.wait()
            await trio.sleep(PASS_GAP)

    async def look_once(self) -> None:
        """One ``Status`` for every engine a request waits for."""
        try:
            reply = await self.broker.request(p.Status(), timeout=2.0)
        except (Unreachable, ControlError) as exc:
            log.debug("no status for the waiting requests: %s", exc)
            return
        if not isinstance(reply, p.StatusReply):
            return
        wall, now = time.time(), trio.current_time()
        waiting = set(self.board.models())
        self.looks = {e.alias: look_of(e, wall) for e in reply.engines if e.alias in waiting}
        for model, look in self.looks.items():
            self.board.saw(model, look, now)

    def tell(self, now: float) -> None:
        """Poke the streams whose progress moved: at once for a new phase, at most every
        ``EVENT_GAP`` for a place in the line or a percentage (when the head of a long
        line goes, everyone behind it moves: one event each per gap, not per grant)."""
        for t in list(self.tickets.values()):
            found = t.progress()  # a request not streamed: its phases timed for the metrics
            if not t.stream or found is None or found.key() == t.shown:
                continue
            if t.shown is None or found.phase != t.shown[0] or now - t.told >= EVENT_GAP:
                t.poke()
