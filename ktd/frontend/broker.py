"""The frontend's side of the claim protocol, carried out: the control client, the long
poll, and the requests waiting at the desk.

The daemon is off the per-request path. For each engine this frontend has traffic
for it holds one standing *claim*, counts its own requests on it and applies the
model's ``max_concurrent``/``max_queue`` itself; a request on a held claim with a
free slot is routed with no message to anyone. Every decision (who goes next, when
to ask for a claim, what a recall or a request's end means) is the pure
``ktd.core.admission.Desk``'s; this module feeds it and does what it answers. The
protocol and its race analysis: ``docs/architecture.md`` and ``ktd.daemon.pool.claimtable``.

What crosses the control socket:

* ``Claim``: one per model when a request finds no claim. However many requests
  arrive meanwhile, they wait on that one claim; a burst of thousands costs one
  message and one reply.
* ``Sync``: a long poll that reports every claim (in flight, idle time, routed or
  not) and the requests waiting per model, and is the heartbeat. The daemon answers
  when it wants a claim back (a recall) or after ``heartbeat_interval``; another
  report goes out soon after a claim turns busy or idle. The first reply also
  carries the admission limits of every model, so a request is admitted by the
  same rules on a fresh frontend as later.
* ``Return``: a claim given back.

While the daemon is away (restart, upgrade) the claims stay good: requests for
engines held here are served as before; only what needs the daemon (a model not
claimed here, a load) gets a 503. When the control socket connects again (a new
daemon bound it) the report goes out at once, so a restarted daemon learns what
this frontend holds before it judges anything idle or expired.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable

import trio

from ktd import protocol as p
from ktd.control.aclient import AsyncClient, Unreachable
from ktd.control.errors import ControlError
from ktd.core import admission as adm
from ktd.core import budget, usage
from ktd.frontend import errors
from ktd.frontend.slot import PendingAsk, Slot
from ktd.frontend.tally import Tokens

log = logging.getLogger("ktd.frontend")

# Extra wait on top of the daemon-side Claim timeout, so the daemon's own
# ``timeout`` error (a clean 504) normally arrives before our local give-up.
_CLAIM_MARGIN = 30.0
# Reports triggered by a change are at most this frequent (the long poll carries the rest).
_REPORT_EVERY = 0.05


def make_client_id() -> str:
    """Unique per frontend process: claims of a restarted frontend are not ours."""
    return f"frontend-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def utc_day(now: float | None = None) -> int:
    """Days since the epoch, UTC: the day a key's tokens count on."""
    return int((time.time() if now is None else now) // 86400)


def _error(reason: object) -> Exception:
    """The desk's refusal as the exception the request flow renders."""
    if isinstance(reason, adm.KeyBusy):
        return errors.make("key_busy", message=str(reason), retry_after=1)
    if isinstance(reason, budget.Exhausted):
        resets = reason.resets * 86400
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(resets))
        return errors.make(
            "key_tokens", message=str(reason), when=when, retry_after=resets - time.time()
        )
    if isinstance(reason, budget.Crowded):
        return errors.make("key_tokens_held", message=str(reason), retry_after=1)
    if isinstance(reason, adm.QueueFull):
        return ControlError(
            p.ErrorCode.QUEUE_FULL,
            str(reason),
            {"queued": reason.waiting, "retry_after": 1.0},
        )
    if isinstance(reason, Exception):
        return reason
    return Unreachable(str(reason))


class ClaimBroker:
    """Owns the control client, the long poll and the desk; admits requests locally."""

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
        self.control = AsyncClient(endpoint, timeout=ping_timeout, on_connect=self._reconnected)
        self.desk = adm.Desk()
        self.daemon_run = ""  # the daemon run our grants come from
        self.seen = 0  # highest grant number received from it
        self._asks: dict[int, PendingAsk] = {}
        self._fetches: dict[str, trio.CancelScope] = {}  # model -> its Claim under way
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._poll: trio.CancelScope | None = None  # the long poll under way
        self._alive: bool | None = None  # None = not known yet; first request pings
        self._first_reply = trio.Event()  # the daemon's limits are known
        self._dirty = trio.Event()
        self._on_unreachable = on_unreachable  # each time the daemon stops answering
        # Each claim's engine key goes to the engine hop (State wires it; issue 32).
        self.on_engine_key: Callable[[str, str | None], None] = lambda url, key: None
        # Per model, how long its oldest waiting request has waited (State wires the
        # board of waiting requests: ``ktd.frontend.waits``; issue 46).
        self.oldest: Callable[[], dict[str, float]] = dict
        self._returning = 0
        self._returned = trio.Event()
        # What this frontend's requests used, until the daemon's ledger holds it.
        self.book = usage.Book(max_rows=p.MAX_REPORTED)
        # Each key's day of tokens: reserved at admission, settled at the end.
        self.budget = budget.Budget()

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
        self._do(self.desk.give_back_all())
        with trio.move_on_after(grace):
            while self._returning:
                await self._returned.wait()
            await self._report_usage()
        self.stop()

    async def _report_usage(self) -> None:
        """Hand the ledger what is still unreported (a frontend that stops takes no
        count with it); a daemon that does not answer gets it from nobody: logged."""
        while (batch := self.book.batch()) is not None:
            try:
                reply = await self.control.request(self.report(), timeout=self.ping_timeout)
            except (Unreachable, ControlError) as exc:
                log.warning("usage not handed to ktd's ledger (%s): lost", exc)
                return
            if isinstance(reply, p.SyncReply):
                self._apply(reply)
            if self.book.sent is batch:  # not acknowledged: a ktd that keeps no ledger
                return

    # ------------------------------------------------------------ carrying out

    def _do(self, actions: list[adm.DeskAction]) -> None:
        for action in actions:
            if isinstance(action, adm.Grant):
                ask = self._asks.pop(action.rid, None)
                if ask is not None:
                    ask.answer(Slot(self, action.held, action.key), None)
                else:  # its request is gone: the slot goes to the next one
                    self._do(self.desk.ended(action.held, trio.current_time(), action.key))
            elif isinstance(action, adm.Refuse):
                ask = self._asks.pop(action.rid, None)
                if ask is not None:
                    reason = action.reason
                    if isinstance(reason, adm.Timeout):
                        reason = ControlError(
                            p.ErrorCode.TIMEOUT,
                            f"{ask.model} not ready after {ask.load_timeout:g}s (the load goes on)",
                        )
                    ask.answer(None, _error(reason))
            elif isinstance(action, adm.Fetch):
                self._start_fetch(action)
            elif isinstance(action, adm.GiveBack):
                self._send_return(action.claim)
            else:
                self._dirty.set()

    def ended(self, held: adm.Held, key: str = "") -> None:
        self._do(self.desk.ended(held, trio.current_time(), key))

    def used(
        self, key: str, model: str, tokens: Tokens | None, *, error: bool, cut: bool = False
    ) -> None:
        """A request of ``key`` on ``model`` ended (``cut``: its client went away before
        the end): into the book for the ledger, and its tokens against the key's day."""
        now = time.time()
        prompt, completion = (0, 0) if tokens is None else (tokens.prompt, tokens.completion)
        count = usage.Count(
            requests=1, prompt=prompt, completion=completion, errors=int(error), cut=int(cut)
        )
        self.book.record(usage.Row(usage.day_of(now), key, model), count)
        if prompt + completion:
            self.budget.spent(key, utc_day(now), prompt + completion)

    def reserve(self, key: adm.KeyTerms, amount: int) -> budget.Reservation:
        """``amount`` tokens of ``key``'s day for a request about to be admitted (its
        ``tokens_per_day``: ``ktd.core.budget``); raises the 429 when they do not fit.
        Every reservation ends with ``release`` (after ``used``)."""
        try:
            held = self.budget.reserve(key.name, key.tokens_per_day, amount, utc_day())
        except (budget.Exhausted, budget.Crowded) as refused:
            raise _error(refused) from None
        if held.amount:
            self._dirty.set()  # the other frontends reserve around it: report soon
        return held

    def release(self, reservation: budget.Reservation) -> None:
        """A request ended: what it reserved goes back (what it used is ``used``'s)."""
        self.budget.release(reservation)
        if reservation.amount:
            self._dirty.set()

    def leave(self, rid: int) -> None:
        self._asks.pop(rid, None)
        self._do(self.desk.leave(rid))

    def tick(self) -> None:
        self._do(self.desk.tick(trio.current_time()))

    def stale(self, slot: Slot) -> None:
        """The engine behind a held claim refused the connection: it is gone (evicted by
        a daemon that could not tell us, or crashed). Stop using the claim, give it back,
        and let the request ask again: nothing was sent, so a retry is safe."""
        self._do(self.desk.recall(slot.held.id, drain=True, idle=0.0, now=trio.current_time()))

    # ------------------------------------------------------------ liveness

    def _mark(self, alive: bool) -> None:
        if not alive and self._alive is not False:
            if self._on_unreachable is not None:
                self._on_unreachable()
            # Requests waiting for the daemon answer 503 now (their claim, if it
            # comes later, is kept: it costs nothing). Held claims keep serving.
            for scope in self._fetches.values():
                scope.cancel()
            self._fetches.clear()
            self._do(self.desk.daemon_lost(Unreachable("ktd stopped answering")))
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

    def _reconnected(self) -> None:
        """The control socket connected again (a daemon bound it): report at once."""
        if self._poll is not None:
            self._poll.cancel()

    async def request(self, msg: p.Request, *, timeout: float | None = None) -> p.Reply:
        """A plain control request (models, status) for the routes that need one."""
        return await self.control.request(msg, timeout=timeout)

    def routed(self) -> list[str]:
        """Aliases this frontend routes to on its own claims (the daemon not needed)."""
        return self.desk.routed()

    # ------------------------------------------------------------ admission

    async def start_acquire(
        self,
        model: str,
        *,
        autoload: bool,
        load_timeout: float,
        key: adm.KeyTerms = adm.ANYONE,
    ) -> PendingAsk:
        """A slot on ``model``'s engine at once if this frontend holds its claim and has
        room; else a place in the line (raises ``queue_full`` past ``max_queue``).

        Only when a claim must be asked for is the daemon involved: then its liveness
        is checked first (or its first reply awaited, which also brings the limits), so
        a request made while ktd is down fails in about ``ping_timeout``.
        """
        if self.desk.needs_daemon(model):
            if self._nursery is None:
                raise Unreachable("the frontend's control client is not running")
            await self._daemon_ready()
        rid, actions = self.desk.arrive(
            model,
            trio.current_time(),
            autoload=autoload,
            load_timeout=load_timeout,
            key=key,
        )
        ask = PendingAsk(self, rid, model, load_timeout)
        self._asks[rid] = ask
        self._do(actions)
        return ask

    async def _daemon_ready(self) -> None:
        if not self.desk.limits_known and self._alive is not False:
            # The first report's reply is under way: it tells whether ktd answers and
            # every model's limits, so the first request is admitted like the later ones.
            with trio.move_on_after(self.ping_timeout):
                await self._first_reply.wait()
            if not self.desk.limits_known:
                raise Unreachable(f"no reply from ktd within {self.ping_timeout:g}s")
        elif self._alive is None:
            await self.ping()
        elif not self._alive:
            # Known down: a short ping, so a restarted daemon is noticed at once
            # but a dead one costs each request only a second.
            await self.ping(min(1.0, self.ping_timeout))

    def _start_fetch(self, fetch: adm.Fetch) -> None:
        if self._nursery is None:
            self._do(self.desk.fetch_failed(fetch.model, Unreachable("not running")))
            return
        scope = trio.CancelScope()
        self._fetches[fetch.model] = scope
        self._nursery.start_soon(self._fetch, fetch, scope)

    async def _fetch(self, fetch: adm.Fetch, scope: trio.CancelScope) -> None:
        """One Claim for every request waiting on the model (on the first one's terms).
        Cancelled when the daemon is lost: a claim granted after all is recalled and
        given back (we do not know it), costing nothing."""
        load = fetch.timeout if fetch.timeout > 0 else math.inf
        limit = load + _CLAIM_MARGIN if math.isfinite(load) else math.inf
        msg = p.Claim(
            model=fetch.model,
            client=self.client_id,
            autoload=fetch.autoload,
            timeout=fetch.timeout or None,
        )
        actions: list[adm.DeskAction] = []
        with scope:
            try:
                reply = await self.control.request(msg, timeout=limit)
            except ControlError as exc:
                # A timeout: those who waited from the start have waited long enough;
                # requests that came later ask again, on their own terms.
                only = fetch.asked if exc.code == p.ErrorCode.TIMEOUT else None
                actions = self.desk.fetch_failed(fetch.model, exc, only=only)
            except Unreachable as exc:
                actions = self.desk.fetch_failed(fetch.model, exc)
            else:
                if isinstance(reply, p.ClaimReply):
                    actions = self._install(fetch.model, reply)
                else:
                    bad = Unreachable(f"unexpected reply: {type(reply).__name__}")
                    actions = self.desk.fetch_failed(fetch.model, bad)
        if self._fetches.get(fetch.model) is scope:
            del self._fetches[fetch.model]
        self._do(actions)

    def _install(self, model: str, reply: p.ClaimReply) -> list[adm.DeskAction]:
        if reply.daemon != self.daemon_run:
            self.daemon_run, self.seen = reply.daemon, 0
        self.seen = max(self.seen, reply.grant)
        self.on_engine_key(reply.url, reply.api_key)  # the engine hop sends it (issue 32)
        grant = adm.ClaimGrant(
            claim=reply.claim,
            alias=reply.alias,
            url=reply.url.rstrip("/"),
            limits=adm.QueueLimits(reply.max_concurrent, reply.max_queue),
        )
        return self.desk.granted(model, grant, trio.current_time())

    # ------------------------------------------------------------ recalls

    def _apply(self, reply: p.SyncReply) -> None:
        if reply.daemon and reply.daemon != self.daemon_run:
            # A restarted daemon: our report told it what we hold; its grants count anew.
            self.daemon_run, self.seen = reply.daemon, 0
        # The daemon's current limits (a reload may have changed them), per model.
        limits = {
            m: adm.QueueLimits(v.max_concurrent, v.max_queue) for m, v in reply.limits.items()
        }
        self._do(self.desk.limits(limits))
        self._first_reply.set()
        self.book.acked(reply.usage_seq)
        self.budget.others = dict(reply.held)  # what the other frontends' requests hold
        if reply.day:  # each key's day, every frontend's use in it
            unreported = self.book.unreported(reply.day)
            day = usage.day_number(reply.day)
            for key in reply.spent.keys() | unreported.keys():
                total = reply.spent.get(key, 0) + unreported.get(key, 0)
                self.budget.spent(key, day, total, total=True)
        now = trio.current_time()
        for claim in reply.dropped:
            self._do(self.desk.dropped(claim))
        for recall in reply.recalls:
            drain = recall.kind != "idle"  # an unknown (newer) kind: the safe reading
            actions = self.desk.recall(recall.claim, drain=drain, idle=recall.idle, now=now)
            log.debug("recall %s %s idle=%g: %s", recall.claim, recall.kind, recall.idle, actions)
            self._do(actions)

    def _send_return(self, claim: str) -> None:
        if self._nursery is not None:
            self._returning += 1
            self._nursery.start_soon(self._return_task, claim)

    async def _return_task(self, claim: str) -> None:
        log.debug("returning claim %s", claim)
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
        batch = self.book.batch()
        return p.Sync(
            client=self.client_id,
            claims=[
                p.ClaimState(
                    claim=h.id,
                    alias=h.alias,
                    url=h.url,
                    in_flight=h.in_flight,
                    idle=0.0 if h.in_flight else max(0.0, now - h.last_end),
                    routing=h.routing,
                )
                for h in self.desk.claims.values()
            ],
            queued=self.desk.queued(),
            oldest=self.oldest(),
            wait=wait,
            daemon=self.daemon_run,
            seen=self.seen,
            usage=[] if batch is None else [usage.to_wire(r, c) for r, c in batch.rows.items()],
            usage_seq=0 if batch is None else batch.seq,
            reserved=self.budget.holding(
                self.book.unreported(usage.day_of(time.time()), sent=False)
            ),
        )

    async def _poll_loop(self) -> None:
        """The long poll: heartbeat, report, and the way recalls reach us at once."""
        misses = 0
        wait = 0.0  # the first report goes out (and comes back) at once
        while True:
            reply: p.Reply | None = None
            with trio.CancelScope() as self._poll:
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
            self._poll = None
            if reply is None:  # reconnected: the parked poll went to a daemon that is gone
                wait = 0.0
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
