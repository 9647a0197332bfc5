"""The frontend's side of the claim protocol: standing claims, local admission, the long poll.

The daemon is off the per-request path. For each engine this frontend has
traffic for it holds one *claim* (granted by the daemon, like a lease, but
standing), counts its own requests on it, and applies the model's
``max_concurrent``/``max_queue`` itself. A request for a model whose claim is
held and has a free slot is routed at once, with no message to anyone. The
daemon's side and the race analysis: ``ktd.daemon.claims``.

What crosses the control socket:

* ``Claim``: one per model when a request finds no claim (a cold model, or one
  given back). However many requests arrive meanwhile, they wait on that one
  claim; so a burst of thousands costs one message and one reply, and nothing
  can be granted to a request that is gone (an unused claim costs nothing: it
  stands for no request and the daemon may recall it at will).
* ``Sync``: a long poll. It reports every claim (in-flight count, idle time,
  whether still routed) and the requests waiting per model, and it is the
  heartbeat. The daemon answers when it wants something back (a recall) or
  after ``heartbeat_interval``; another report goes out soon after a claim
  turns busy or idle, so ``ktctl status`` and the daemon's choice of what to
  evict stay current.
* ``Return``: a claim given back, when a recall asked for it.

Recalls: ``drain`` (evict, swap, shutdown) stops routing to the engine at once;
the claim goes back when its last request here ends, and requests that arrive
meanwhile ask for a new claim (they wait for the swap or the reload, at the
daemon). ``idle`` (TTL, restart after reload) goes back only if no request ran
for that long; otherwise the report says so.

While the daemon is away (restart, upgrade) the claims stay good: requests for
engines held here are served as before; only what needs the daemon (a model
not claimed here, a load) gets a 503. On reconnect the next report tells the
new daemon what this frontend holds.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections import deque
from collections.abc import Callable

import trio

from ktd import protocol as p
from ktd.control.aclient import AsyncClient, Unreachable
from ktd.control.errors import ControlError

log = logging.getLogger("ktd.frontend")

# Extra wait on top of the daemon-side Claim timeout, so the daemon's own
# ``timeout`` error (a clean 504) normally arrives before our local give-up.
_CLAIM_MARGIN = 30.0
# Reports triggered by a change are at most this frequent (the long poll carries the rest).
_REPORT_EVERY = 0.05


def make_client_id() -> str:
    """Unique per frontend process: claims of a restarted frontend are not ours."""
    return f"frontend-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Held:
    """A standing claim held here: where its engine is and how busy it is."""

    __slots__ = (
        "alias",
        "entry",
        "id",
        "inflight",
        "last_end",
        "return_when_idle",
        "routing",
        "url",
    )

    def __init__(self, reply: p.ClaimReply, entry: Entry) -> None:
        self.id = reply.claim
        self.alias = reply.alias
        self.url = reply.url.rstrip("/")
        self.entry = entry
        self.inflight = 0
        self.last_end = trio.current_time()
        self.routing = True
        self.return_when_idle = False  # an ``idle 0`` recall: give back when next idle


class Entry:
    """One model name: its claim, the claim being asked for, the requests waiting."""

    __slots__ = ("fetch", "held", "max_concurrent", "max_queue", "model", "waiters")

    def __init__(self, model: str) -> None:
        self.model = model
        self.held: Held | None = None
        self.fetch: trio.CancelScope | None = None  # the Claim under way
        self.waiters: deque[Waiter] = deque()
        self.max_concurrent: int | None = None
        self.max_queue: int | None = None

    def has_slot(self) -> bool:
        held = self.held
        if held is None or not held.routing:
            return False
        return self.max_concurrent is None or held.inflight < self.max_concurrent


class Slot:
    """One request's place on a claim: where to send it. ``leave()`` when it ends."""

    __slots__ = ("_broker", "_held", "alias", "left", "url")

    def __init__(self, broker: ClaimBroker, held: Held) -> None:
        self._broker = broker
        self._held = held
        self.alias = held.alias
        self.url = held.url
        self.left = False
        held.inflight += 1
        if held.inflight == 1:
            broker.changed()

    def leave(self) -> None:
        """Synchronous and idempotent: safe from ``finally`` in a cancelled scope."""
        if self.left:
            return
        self.left = True
        self._broker.left(self._held)


class Waiter:
    """A request waiting for a slot; its own ``load_timeout`` and ``autoload`` go with it."""

    __slots__ = ("autoload", "deadline", "error", "event", "gone", "load_timeout", "slot")

    def __init__(self, *, autoload: bool, load_timeout: float) -> None:
        self.event = trio.Event()
        self.slot: Slot | None = None
        self.error: Exception | None = None
        self.gone = False
        self.autoload = autoload
        self.load_timeout = load_timeout  # 0: none
        self.deadline = trio.current_time() + (load_timeout if load_timeout > 0 else math.inf)


class Admission:
    """A request's way to a slot: granted at once, or waited on (in slices if it likes)."""

    __slots__ = ("_broker", "_entry", "_waiter", "claimed", "slot")

    def __init__(
        self, broker: ClaimBroker, entry: Entry, *, slot: Slot | None, waiter: Waiter | None
    ) -> None:
        self._broker = broker
        self._entry = entry
        self._waiter = waiter
        self.slot = slot
        self.claimed = slot is not None

    async def wait(self, limit: float = math.inf) -> Slot | None:
        """The slot, or None if ``limit`` seconds passed first. Raises the daemon's error."""
        if self.slot is not None:
            self.claimed = True
            return self.slot
        waiter = self._waiter
        assert waiter is not None
        until = min(trio.current_time() + limit, waiter.deadline)
        with trio.move_on_at(until):
            await waiter.event.wait()
        if waiter.error is not None:
            raise waiter.error
        if waiter.slot is not None:
            self.slot = waiter.slot
            self.claimed = True
            return self.slot
        if trio.current_time() >= waiter.deadline:
            self.abandon()
            raise ControlError(
                p.ErrorCode.TIMEOUT,
                f"{self._entry.model} not ready after {waiter.load_timeout:g}s (the load goes on)",
            )
        return None

    def abandon(self) -> None:
        """Give up unless claimed: a slot given to us meanwhile goes to the next request."""
        if self.claimed:
            return
        waiter = self._waiter
        if waiter is None or waiter.gone:
            return
        waiter.gone = True
        if waiter.slot is not None:
            waiter.slot.leave()
        else:
            try:
                self._entry.waiters.remove(waiter)
            except ValueError:
                pass
            self._broker.changed()


class ClaimBroker:
    """Owns the control client, the long poll and the claims; admits requests locally."""

    def __init__(
        self,
        endpoint: str,
        *,
        client_id: str | None = None,
        heartbeat_interval: float = 5.0,
        ping_timeout: float = 2.0,
        on_unreachable: Callable[[], object] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.client_id = client_id or make_client_id()
        self.heartbeat_interval = max(0.2, heartbeat_interval)
        self.ping_timeout = ping_timeout
        self.control = AsyncClient(endpoint, timeout=ping_timeout)
        self.entries: dict[str, Entry] = {}
        self.claims: dict[str, Held] = {}
        self.daemon_run = ""  # the daemon run our grants come from
        self.seen = 0  # highest grant number received from it
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._alive: bool | None = None  # None = not known yet; first request pings
        self._dirty = trio.Event()
        self._on_unreachable = on_unreachable  # each time the daemon stops answering
        self._returning = 0
        self._returned = trio.Event()

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()``; start with ``await nursery.start(broker.run)``."""
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                await nursery.start(self.control.run)
                self._nursery = nursery
                nursery.start_soon(self._poll_loop)
                nursery.start_soon(self._report_loop)
                task_status.started()
        self._nursery = None

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def aclose(self, grace: float = 2.0) -> None:
        """Give every claim back (bounded), then stop: the daemon need not wait out
        ``lease_ttl`` to know this frontend is gone."""
        for held in list(self.claims.values()):
            held.routing = False
            if held.inflight == 0:
                self._give_back(held)
        with trio.move_on_after(grace):
            while self._returning:
                await self._returned.wait()
        self.stop()

    # ------------------------------------------------------------ liveness

    def _mark(self, alive: bool) -> None:
        if not alive and self._alive is not False:
            if self._on_unreachable is not None:
                self._on_unreachable()
            # Requests waiting for the daemon answer 503 now (their claim, if it
            # comes later, is kept: it costs nothing). Held claims keep serving.
            for entry in self.entries.values():
                if entry.fetch is not None:
                    entry.fetch.cancel()
                    entry.fetch = None
                    self._fail(entry, Unreachable("ktd stopped answering"))
        self._alive = alive

    async def ping(self, timeout: float | None = None) -> p.Pong:
        """Raise ``Unreachable`` unless the daemon answers within ``timeout``."""
        try:
            reply = await self.control.request(p.Ping(), timeout=timeout or self.ping_timeout)
        except Unreachable:
            self._mark(False)
            raise
        self._mark(True)
        if not isinstance(reply, p.Pong):
            raise Unreachable(f"unexpected reply to ping: {type(reply).__name__}")
        return reply

    async def request(self, msg: p.Request, *, timeout: float | None = None) -> p.Reply:
        """A plain control request (models, status) for the routes that need one."""
        return await self.control.request(msg, timeout=timeout)

    def routed(self) -> list[str]:
        """Aliases this frontend routes to on its own claims (the daemon not needed)."""
        return sorted({h.alias for h in self.claims.values() if h.routing})

    # ------------------------------------------------------------ admission

    async def start_acquire(self, model: str, *, autoload: bool, load_timeout: float) -> Admission:
        """A slot on ``model``'s engine at once if this frontend holds its claim and has
        room; else a place in the line (raises ``queue_full`` past ``max_queue``).

        Only when a claim must be asked for is the daemon involved: then its liveness
        is checked first, so a request made while ktd is down fails in ~``ping_timeout``.
        """
        entry = self.entries.get(model)
        if entry is None:
            entry = self.entries[model] = Entry(model)
        if not entry.waiters and entry.has_slot():
            assert entry.held is not None
            return Admission(self, entry, slot=Slot(self, entry.held), waiter=None)
        limit = entry.max_queue
        if limit is not None and len(entry.waiters) >= limit:
            raise ControlError(
                p.ErrorCode.QUEUE_FULL,
                f"{len(entry.waiters)} request(s) already waiting (max_queue {limit})",
                {"queued": len(entry.waiters), "retry_after": 1.0},
            )
        if entry.held is None or not entry.held.routing:
            if self._nursery is None:
                raise Unreachable("the frontend's control client is not running")
            if self._alive is None:
                await self.ping()
            elif not self._alive:
                # Known down: a short ping, so a restarted daemon is noticed at once
                # but a dead one costs each request only a second.
                await self.ping(min(1.0, self.ping_timeout))
        waiter = Waiter(autoload=autoload, load_timeout=load_timeout)
        entry.waiters.append(waiter)
        self.changed()
        self._serve(entry)
        return Admission(self, entry, slot=None, waiter=waiter)

    def _serve(self, entry: Entry) -> None:
        """Hand free slots to waiters in arrival order; ask for a claim if there is none."""
        while entry.waiters:
            if entry.held is None or not entry.held.routing:
                if entry.fetch is None and self._nursery is not None:
                    entry.fetch = trio.CancelScope()
                    self._nursery.start_soon(self._fetch, entry, entry.fetch)
                return
            if not entry.has_slot():
                return
            waiter = entry.waiters.popleft()
            if waiter.gone:
                continue
            waiter.slot = Slot(self, entry.held)
            waiter.event.set()
            self.changed()

    async def _fetch(self, entry: Entry, scope: trio.CancelScope) -> None:
        """One Claim for every request waiting on ``entry`` (on the first one's terms);
        asked again while some still wait. Cancelled when the daemon is lost: a claim
        granted after all is recalled and given back (we do not know it), costing nothing.
        """
        try:
            with scope:
                await self._fetch_claim(entry)
        finally:
            if entry.fetch is scope:
                entry.fetch = None
            self._serve(entry)

    async def _fetch_claim(self, entry: Entry) -> None:
        while entry.waiters:
            first = entry.waiters[0]
            load = first.load_timeout if first.load_timeout > 0 else math.inf
            limit = load + _CLAIM_MARGIN if math.isfinite(load) else math.inf
            msg = p.Claim(
                model=entry.model,
                client=self.client_id,
                autoload=first.autoload,
                timeout=first.load_timeout or None,
            )
            asked = list(entry.waiters)
            try:
                reply = await self.control.request(msg, timeout=limit)
            except ControlError as exc:
                if exc.code == p.ErrorCode.TIMEOUT:
                    # Those who waited from the start have waited long enough; requests
                    # that came later ask again, on their own terms.
                    self._fail(entry, exc, only=asked)
                    continue
                self._fail(entry, exc)
                return
            except Unreachable as exc:
                self._fail(entry, exc)
                return
            if not isinstance(reply, p.ClaimReply):
                self._fail(entry, Unreachable(f"unexpected reply: {type(reply).__name__}"))
                return
            self._install(entry, reply)
            return

    def _install(self, entry: Entry, reply: p.ClaimReply) -> None:
        if reply.daemon != self.daemon_run:
            self.daemon_run, self.seen = reply.daemon, 0
        self.seen = max(self.seen, reply.grant)
        held = self.claims.get(reply.claim)
        if held is None:
            held = self.claims[reply.claim] = Held(reply, entry)
        entry.held = held
        entry.max_concurrent = reply.max_concurrent
        entry.max_queue = reply.max_queue
        self.changed()

    def _fail(self, entry: Entry, exc: Exception, *, only: list[Waiter] | None = None) -> None:
        failing = list(entry.waiters) if only is None else only
        for waiter in failing:
            waiter.error = exc
            waiter.event.set()
        gone = {id(w) for w in failing}
        entry.waiters = deque(w for w in entry.waiters if id(w) not in gone)
        self.changed()

    def left(self, held: Held) -> None:
        """A request on ``held`` ended: next waiter in, or the claim back if it is due."""
        held.inflight -= 1
        if held.inflight:
            self._serve(held.entry)
            return
        held.last_end = trio.current_time()
        self.changed()
        if not held.routing or held.return_when_idle:
            self._give_back(held)
        else:
            self._serve(held.entry)

    # ------------------------------------------------------------ recalls

    def _apply(self, reply: p.SyncReply) -> None:
        if reply.daemon and reply.daemon != self.daemon_run:
            # A restarted daemon: our report told it what we hold; its grants count anew.
            self.daemon_run, self.seen = reply.daemon, 0
        # The daemon's current limits (a reload may have changed them), per model.
        for model, entry in self.entries.items():
            limits = reply.limits.get(model)
            if limits is None:
                entry.max_concurrent = entry.max_queue = None
            else:
                entry.max_concurrent, entry.max_queue = limits.max_concurrent, limits.max_queue
        for claim in reply.dropped:
            held = self.claims.pop(claim, None)
            if held is not None:
                self._stop_routing(held)
        for recall in reply.recalls:
            self._recall(recall)

    def _recall(self, recall: p.Recall) -> None:
        held = self.claims.get(recall.claim)
        if held is None:
            # Not ours (any more): say so, or the daemon keeps asking.
            self._send_return(recall.claim)
            return
        idle = held.inflight == 0 and trio.current_time() - held.last_end >= recall.idle
        if recall.kind == "drain":
            if held.inflight == 0:
                self._give_back(held)  # which stops routing there too
            else:
                self._stop_routing(held)  # given back when its last request ends
        elif idle:
            self._give_back(held)
        elif recall.idle <= 0:
            held.return_when_idle = True
        else:
            self.changed()  # busier than asked: the report answers the recall

    def _stop_routing(self, held: Held) -> None:
        held.routing = False
        entry = held.entry
        if entry.held is held:
            entry.held = None
            self._serve(entry)  # its waiters ask the daemon for a new claim
        self.changed()

    def _give_back(self, held: Held) -> None:
        if self.claims.pop(held.id, None) is None:
            return
        self._stop_routing(held)
        self._send_return(held.id)

    def _send_return(self, claim: str) -> None:
        if self._nursery is not None:
            self._returning += 1
            self._nursery.start_soon(self._return_task, claim)

    async def _return_task(self, claim: str) -> None:
        try:
            for attempt in range(3):
                try:
                    await self.control.request(
                        p.Return(client=self.client_id, claim=claim), timeout=self.ping_timeout
                    )
                    return
                except ControlError as exc:
                    log.debug("return of claim %s refused: %s", claim, exc)
                    return
                except Unreachable:
                    await trio.sleep(0.5 * (attempt + 1))
            # Not lost: the next report no longer lists it, which gives it back too.
            log.info("could not return claim %s yet: ktd unreachable", claim)
        finally:
            self._returning -= 1
            if not self._returning:
                self._returned.set()
                self._returned = trio.Event()

    # ------------------------------------------------------------ reports

    def changed(self) -> None:
        """Something the daemon should know soon (a claim busy/idle, the queue)."""
        self._dirty.set()

    def report(self, wait: float = 0.0) -> p.Sync:
        now = trio.current_time()
        return p.Sync(
            client=self.client_id,
            claims=[
                p.ClaimState(
                    claim=h.id,
                    alias=h.alias,
                    url=h.url,
                    inflight=h.inflight,
                    idle=0.0 if h.inflight else max(0.0, now - h.last_end),
                    routing=h.routing,
                )
                for h in self.claims.values()
            ],
            queued={m: len(e.waiters) for m, e in self.entries.items() if e.waiters},
            wait=wait,
            daemon=self.daemon_run,
            seen=self.seen,
        )

    async def _poll_loop(self) -> None:
        """The long poll: heartbeat, report, and the way recalls reach us at once."""
        misses = 0
        wait = 0.0  # the first report goes out (and comes back) at once
        while True:
            try:
                reply = await self.control.request(
                    self.report(wait), timeout=wait + self.ping_timeout
                )
            except Unreachable:
                misses += 1
                # One miss can be a hiccup; two in a row and waiting requests give up.
                if misses >= 2 or self._alive is not True:
                    self._mark(False)
                wait = 0.0
                await trio.sleep(min(1.0, self.heartbeat_interval))
                continue
            except ControlError as exc:
                log.warning("ktd refused the frontend's report: %s", exc)
                self._mark(True)
                await trio.sleep(self.heartbeat_interval)
                continue
            misses = 0
            self._mark(True)
            if isinstance(reply, p.SyncReply):
                self._apply(reply)
            wait = self.heartbeat_interval

    async def _report_loop(self) -> None:
        """A report soon after a change, at most every ``_REPORT_EVERY`` seconds."""
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            if self._alive:
                try:
                    reply = await self.control.request(self.report(), timeout=self.ping_timeout)
                except (Unreachable, ControlError):
                    pass  # the long poll reports too
                else:
                    if isinstance(reply, p.SyncReply):
                        self._apply(reply)
            await trio.sleep(_REPORT_EVERY)
