"""The frontend's side of the lease protocol: acquire, release, heartbeat.

Why a broker and not a plain ``await client.request(Acquire(...))`` in the route:

* A client that disconnects while its model loads cancels the route, but the
  daemon goes on and grants the lease when the load ends. Nobody would release
  it, and since this frontend keeps heartbeating the lease would pin the engine
  forever. So each acquire runs in a task owned by the broker; the route only
  *waits* for it, and a result nobody waits for any more is released at once.
  (The load itself goes on: llama-swap #43 / Ollama #8398 — one client's cancel
  must not cancel the load for everyone.)
* Releases are fire-and-forget into the same nursery, so a response's end never
  waits for a round trip to the daemon and a cancelled request still releases.
* Heartbeats keep our leases alive (the daemon expires a client's leases after
  ``daemon.lease_ttl`` of silence) and tell us, cheaply, whether the daemon is
  there: a request arriving while it is down gets a 503 in about a second
  instead of waiting out a 30-minute load timeout.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Callable

import trio

from ktd import protocol as p
from ktd.control.aclient import AsyncClient, Unreachable
from ktd.control.errors import ControlError

log = logging.getLogger("ktd.frontend")

# Extra wait on top of the daemon-side Acquire timeout, so the daemon's own
# ``timeout`` error (a clean 504) normally arrives before our local give-up.
_ACQUIRE_MARGIN = 30.0


def make_client_id() -> str:
    """Unique per frontend process: leases of a restarted frontend are not ours."""
    return f"frontend-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _Pending:
    """One acquire in flight.

    ``wake`` is set when the reply (or error) is in, or when the daemon is lost;
    ``finished`` tells the two apart.
    """

    __slots__ = ("abandoned", "error", "finished", "reply", "wake")

    def __init__(self) -> None:
        self.wake = trio.Event()
        self.finished = False
        self.reply: p.AcquireReply | None = None
        self.error: Exception | None = None
        self.abandoned = False


class Lease:
    """A granted lease: where to send the request, and what to release after."""

    __slots__ = ("alias", "lease", "url")

    def __init__(self, reply: p.AcquireReply) -> None:
        self.lease = reply.lease
        self.alias = reply.alias
        self.url = reply.url.rstrip("/")


class LeaseBroker:
    """Owns the control client, the heartbeat task and every acquire/release task."""

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
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        # None = not known yet; first request pings before trusting it.
        self._alive: bool | None = None
        self._pendings: set[_Pending] = set()
        self._releasing = 0
        self._released = trio.Event()
        self._on_unreachable = on_unreachable  # each time the daemon stops answering

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()``; start with ``await nursery.start(broker.run)``."""
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                await nursery.start(self.control.run)
                self._nursery = nursery
                nursery.start_soon(self._heartbeat_loop)
                task_status.started()
        self._nursery = None

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def aclose(self, grace: float = 2.0) -> None:
        """Let queued releases reach the daemon (bounded), then stop.

        At shutdown the last requests end (and release) just before this runs;
        without the grace their leases would linger until ``lease_ttl``.
        """
        with trio.move_on_after(grace):
            while self._releasing:
                await self._released.wait()
        self.stop()

    # ------------------------------------------------------------ liveness

    def _mark(self, alive: bool) -> None:
        if not alive and self._alive is not False:
            if self._on_unreachable is not None:
                self._on_unreachable()
            # Wake every waiter: they answer 503 now; their acquire tasks go on
            # and release whatever a recovered daemon grants later.
            for pending in self._pendings:
                pending.wake.set()
        self._alive = alive

    async def _heartbeat_loop(self) -> None:
        misses = 0
        while True:
            try:
                await self.control.request(
                    p.Heartbeat(client=self.client_id),
                    timeout=min(self.heartbeat_interval, self.ping_timeout),
                )
            except Unreachable:
                misses += 1
                # One miss can be a hiccup; two in a row and waiting requests give up.
                if misses >= 2 or self._alive is not True:
                    self._mark(False)
            except ControlError as exc:
                # An old daemon without heartbeats still answers: it is alive.
                log.debug("heartbeat refused: %s", exc)
                misses = 0
                self._mark(True)
            else:
                misses = 0
                self._mark(True)
            await trio.sleep(self.heartbeat_interval)

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

    async def request(
        self,
        msg: p.Request,
        *,
        timeout: float | None = None,
    ) -> p.Reply:
        """A plain control request (models, status) for the routes that need one."""
        return await self.control.request(msg, timeout=timeout)

    # ------------------------------------------------------------ leases

    async def acquire(self, model: str, *, autoload: bool, load_timeout: float) -> Lease:
        """Wait for a lease on ``model``; raises ``ControlError`` or ``Unreachable``.

        Cancel-safe: if the caller goes away, the lease (whenever it comes) is released.
        """
        handle = await self.start_acquire(model, autoload=autoload, load_timeout=load_timeout)
        try:
            lease = await handle.wait()
        finally:
            handle.abandon()  # no-op once claimed
        assert lease is not None
        return lease

    async def start_acquire(
        self, model: str, *, autoload: bool, load_timeout: float
    ) -> AcquireHandle:
        """Send the Acquire and return at once; the caller waits on the handle.

        Pings first when the daemon's liveness is unknown or bad, so a request
        made while ktd is down fails in ~``ping_timeout``, not after the load timeout.
        """
        if self._nursery is None:
            raise Unreachable("the frontend's control client is not running")
        if self._alive is None:
            await self.ping()
        elif not self._alive:
            # Known down: a short ping, so a restarted daemon is noticed at once
            # but a dead one costs each request only a second.
            await self.ping(min(1.0, self.ping_timeout))
        pending = _Pending()
        self._pendings.add(pending)
        msg = p.Acquire(model=model, client=self.client_id, autoload=autoload, timeout=load_timeout)
        self._nursery.start_soon(self._acquire_task, pending, msg)
        return AcquireHandle(self, pending)

    async def _acquire_task(self, pending: _Pending, msg: p.Acquire) -> None:
        load = math.inf if msg.timeout is None else msg.timeout
        limit = load + _ACQUIRE_MARGIN if math.isfinite(load) else math.inf
        try:
            reply = await self.control.request(msg, timeout=limit)
        except (Unreachable, ControlError) as exc:
            pending.error = exc
        else:
            if not isinstance(reply, p.AcquireReply):
                pending.error = Unreachable(f"unexpected reply to acquire: {type(reply).__name__}")
            elif pending.abandoned:
                self.release(reply.lease)
            else:
                pending.reply = reply
        finally:
            pending.finished = True
            self._pendings.discard(pending)
            pending.wake.set()

    def release(self, lease: str) -> None:
        """Release in the background: never blocks, works from a cancelled scope."""
        if self._nursery is None:
            return  # shutting down: the daemon expires our leases with the heartbeat
        self._nursery.start_soon(self._release_task, lease)

    async def _release_task(self, lease: str) -> None:
        self._releasing += 1
        try:
            for attempt in range(3):
                try:
                    await self.control.request(p.Release(lease=lease), timeout=self.ping_timeout)
                    return
                except ControlError as exc:
                    log.debug("release %s refused: %s", lease, exc)  # e.g. expired already
                    return
                except Unreachable:
                    await trio.sleep(0.5 * (attempt + 1))
            log.warning("could not release lease %s: ktd unreachable (it will expire)", lease)
        finally:
            self._releasing -= 1
            if not self._releasing:
                self._released.set()
                self._released = trio.Event()


class AcquireHandle:
    """A pending acquire that a route (or a stream body) waits on, in slices if it likes."""

    __slots__ = ("_broker", "_pending", "claimed")

    def __init__(self, broker: LeaseBroker, pending: _Pending) -> None:
        self._broker = broker
        self._pending = pending
        self.claimed = False

    @property
    def ready(self) -> bool:
        return self._pending.wake.is_set()

    async def wait(self, limit: float = math.inf) -> Lease | None:
        """The lease, or None if ``limit`` seconds passed first. Raises the daemon's error."""
        pending = self._pending
        with trio.move_on_after(limit):
            await pending.wake.wait()
        if not pending.wake.is_set():
            return None
        if not pending.finished:
            raise Unreachable("ktd stopped answering while the request waited for an engine")
        if pending.error is not None:
            raise pending.error
        if pending.reply is None:  # abandoned already
            raise Unreachable("lease was abandoned")
        self.claimed = True
        return Lease(pending.reply)

    def abandon(self) -> None:
        """Give up unless claimed: a lease granted now or later is released."""
        if self.claimed:
            return
        pending = self._pending
        if pending.abandoned:
            return
        pending.abandoned = True
        if pending.reply is not None:
            self._broker.release(pending.reply.lease)
            pending.reply = None
