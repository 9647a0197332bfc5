"""The dashboard's live side: the daemon's events in, one stream of messages per page out.

Off the proxy's path. Two kinds of work, both in tasks of their own:

* **Always**, every ``sample_interval`` seconds: one reading of the counters that
  exist anyway (the frontend's metrics, each ready engine's ``/metrics`` when it was
  started with ``--enable-metrics``) into the hour of traffic history (series.py).
* **While a page is open** (and ``linger`` seconds after the last one closed, so a
  reload does not churn): one task owning one SUB socket on the daemon's
  ``events.sock`` (the ``zmqtrio`` pump), and the refreshers. An ``engine.`` or
  ``lease.`` event makes the status refresh at once (coalesced over a few
  milliseconds); a ``pull.`` event carries its job, which goes into the view as it is;
  ``log.<alias>`` lines go straight to the pages following that
  alias; the daemon's greeting (``WELCOME``, also after a daemon restart: zmq
  reconnects and subscribes again) refreshes everything. Status is refreshed every
  ``status_every`` seconds anyway (queue counts move without events), the machine
  every ``machine_every``. A view is pushed only when it changed.

A page's queue is bounded: a page that cannot keep up is dropped (its stream ends and
the browser reconnects with a fresh view), never allowed to hold memory or the others.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import trio
import zmq

from ktd import paths
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import Frames, TrioSocket
from ktd.core import states as S
from ktd.core.loglines import Seam, probe_path
from ktd.frontend.broker import ClaimBroker
from ktd.frontend.metrics import Metrics
from ktd.frontend.scrape import scrape_engines
from ktd.frontend.ui import series, view, wire
from ktd.frontend.upstream import UpstreamPool
from ktd.pullwire import PullInfo

log = logging.getLogger("ktd.frontend.ui")

QUEUE = 512  # messages a page may have waiting
COALESCE = 0.02  # a burst of events makes one status refresh
MACHINE_COALESCE = 0.5  # and at most about one machine read (nvidia-smi) per half second
SUBSCRIBE_WAIT = 2.0  # how long a new page waits for the subscription before its log tail
PLAN_TTL = 3.0  # dry-runs shared between pages for this long
PLAN_TIMEOUT = 150.0  # the daemon may probe the engine's Python first (120 s at most)
MACHINE_TIMEOUT = 20.0  # nvidia-smi may take up to 15 s
_TOPICS = (b"engine.", b"log.", b"lease.", b"pull.")


@dataclass(frozen=True, slots=True)
class LogLines:
    """Log lines of the page's alias, and the log's line count after them (``Event.upto``)."""

    upto: int
    lines: list[str]


Item = bytes | LogLines  # an encoded message, or log lines of the page's alias


def events_endpoint(control_endpoint: str) -> str:
    """The daemon's events socket, beside its control socket."""
    return paths.endpoint(paths.events_path(Path(control_endpoint.removeprefix("ipc://"))))


class Viewer:
    """One open page: its queue, and the alias whose log it follows (None: none)."""

    __slots__ = ("logs", "recv", "seam", "send")

    def __init__(self, logs: str | None) -> None:
        self.logs = logs
        self.send, self.recv = trio.open_memory_channel[Item](QUEUE)
        self.seam = Seam()  # set when its tail is sent

    def fresh(self, batch: LogLines) -> list[str]:
        """``batch``'s lines unless the tail sent already holds them."""
        return self.seam.fresh(batch.upto, batch.lines)

    def push(self, item: Item) -> None:
        try:
            self.send.send_nowait(item)
        except trio.WouldBlock:
            self.drop()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def drop(self) -> None:
        """End this page's stream once what is queued went out (too slow, or stopping):
        the stream's reader then sees the end of the channel, between two writes."""
        self.send.close()


class Wakeup:
    """A refresh loop's early wake-up: set by any number of events, consumed once by the
    loop (which then waits a moment more, so a burst of events costs one refresh)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, limit: float) -> bool:
        """Until set or ``limit`` seconds passed; whether it was set (then it is reset)."""
        event = self._event
        with trio.move_on_after(limit):
            await event.wait()
        if event.is_set():
            self._event = trio.Event()
            return True
        return False


async def _refresh_loop(
    refresh: Callable[[], Awaitable[None]], wakeup: Wakeup, every: float, coalesce: float
) -> None:
    """``refresh`` every ``every`` seconds, and ``coalesce`` seconds after a wake-up."""
    while True:
        await refresh()
        if await wakeup.wait(every):
            await trio.sleep(coalesce)


class Hub:
    def __init__(
        self,
        broker: ClaimBroker,
        upstream: UpstreamPool,
        metrics: Metrics,
        *,
        sample_interval: float = 10.0,
        status_every: float = 2.0,
        machine_every: float = 5.0,
        linger: float = 10.0,
    ) -> None:
        self.broker = broker
        self.upstream = upstream
        self.metrics = metrics
        self.events = events_endpoint(broker.endpoint)
        self.book = series.SeriesBook(sample_interval)
        self.sample_interval = sample_interval
        self.status_every = status_every
        self.machine_every = machine_every
        self.linger = linger
        self.viewers: set[Viewer] = set()
        self.closing = trio.Event()
        self.subscribed = trio.Event()
        self._viewers_changed = trio.Event()
        self._poke = Wakeup()
        self._machine_poke = Wakeup()
        self._refreshing = trio.Lock()
        self._models: list[p.ModelInfo] = []
        self._engines: list[p.EngineInfo] = []
        self._machine: p.MachineReply | None = None
        self._pulls: dict[str, PullInfo] = {}  # by ``repo@revision``, in the daemon's order
        self._daemon_error: str | None = "not asked yet"
        self._view: bytes = b""
        self._view_at = -math.inf
        self._plans: dict[str, tuple[float, dict[str, Any]]] = {}

    # ------------------------------------------------------------ pages

    def join(self, logs: str | None) -> Viewer:
        viewer = Viewer(logs)
        self.viewers.add(viewer)
        self._changed()
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)
        viewer.send.close()
        self._changed()

    def close(self) -> None:
        """Shutdown: every stream ends now (Hypercorn's graceful wait is for requests)."""
        self.closing.set()
        for viewer in self.viewers:
            viewer.drop()

    def _changed(self) -> None:
        self._viewers_changed.set()
        self._viewers_changed = trio.Event()

    def _broadcast(self, item: bytes) -> None:
        for viewer in list(self.viewers):
            viewer.push(item)

    # ------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sampler)
            nursery.start_soon(self._watch_while_viewed)
            task_status.started()

    async def _watch_while_viewed(self) -> None:
        while True:
            while not self.viewers:
                await self._viewers_changed.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._subscriber)
                nursery.start_soon(self._status_loop)
                nursery.start_soon(self._machine_loop)
                await self._until_unwatched()
                nursery.cancel_scope.cancel()
            self.subscribed = trio.Event()

    async def _until_unwatched(self) -> None:
        """Returns once no page has been open for ``linger`` seconds."""
        while True:
            changed = self._viewers_changed
            if self.viewers:
                await changed.wait()
                continue
            with trio.move_on_after(self.linger):
                await changed.wait()
            if not self.viewers and not changed.is_set():
                return

    async def _subscriber(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        for topic in (*_TOPICS, p.WELCOME):
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.connect(self.events)
        pump = TrioSocket(sock, self._on_event)
        try:
            await pump.run()
        finally:
            pump.close()

    def _on_event(self, frames: Frames) -> None:
        topic = frames[0]
        if topic == p.WELCOME:
            # Subscribed (again, after a daemon restart): what happened meanwhile is unknown.
            self.subscribed.set()
            self._poke.set()
            self._machine_poke.set()
        elif topic.startswith(b"log.") and len(frames) > 1:
            alias = topic[4:].decode("utf-8", "replace")
            followers = [v for v in self.viewers if v.logs == alias]
            if not followers:
                return
            try:
                ev = p.decode_event(frames[1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
            for viewer in followers:
                viewer.push(LogLines(ev.upto, list(ev.lines)))
        elif topic.startswith(b"engine."):
            self._poke.set()
            self._machine_poke.set()  # a load or a stop changes who holds what
        elif topic.startswith(b"lease."):
            self._poke.set()
        elif topic.startswith(b"pull.") and len(frames) > 1:
            # A job's bytes move several times a second: the event carries the job, so the
            # bar moves without asking the daemon anything.
            try:
                ev = p.decode_event(frames[1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
            if ev.pull is not None:
                self._pulls[ev.pull.key] = ev.pull
                self._publish_view()

    async def _status_loop(self) -> None:
        await _refresh_loop(self.refresh, self._poke, self.status_every, COALESCE)

    async def _machine_loop(self) -> None:
        await _refresh_loop(
            self._refresh_machine, self._machine_poke, self.machine_every, MACHINE_COALESCE
        )

    # ------------------------------------------------------------ the view

    async def refresh(self) -> None:
        """Ask the daemon for status and models; push the view if it changed."""
        async with self._refreshing:
            try:
                status = await self.broker.request(p.Status(), timeout=2.0)
                models = await self.broker.request(p.Models(), timeout=2.0)
            except (Unreachable, ControlError) as exc:
                self._daemon_error = str(exc) or type(exc).__name__
            else:
                if isinstance(status, p.StatusReply) and isinstance(models, p.ModelsReply):
                    self._engines, self._models = list(status.engines), list(models.models)
                    self._daemon_error = None
                await self._refresh_pulls()
            self._view_at = trio.current_time()
            self._publish_view()

    async def _refresh_pulls(self) -> None:
        """The pull jobs as the daemon lists them (what the events said meanwhile, and the
        jobs that ended or went while no page was subscribed). A daemon older than
        protocol 1.2 has none to list."""
        try:
            reply = await self.broker.request(p.Pulls(), timeout=2.0)
        except (Unreachable, ControlError):
            return
        if isinstance(reply, p.PullsReply):
            self._pulls = {j.key: j for j in reply.jobs}

    async def _refresh_machine(self) -> None:
        try:
            reply = await self.broker.request(p.Machine(), timeout=MACHINE_TIMEOUT)
        except (Unreachable, ControlError):
            return  # the status refresh says the daemon is away; keep the last picture
        if isinstance(reply, p.MachineReply):
            self._machine = reply
            self._publish_view()

    def _publish_view(self) -> None:
        data = wire.encode(
            view.build(
                self._models,
                self._engines,
                self._machine,
                daemon_error=self._daemon_error,
                pulls=list(self._pulls.values()),
            )
        )
        if data != self._view:
            self._view = data
            self._broadcast(self.view_message())

    async def current_view(self) -> bytes:
        """``{"now", "view"}``, refreshed first if older than ``status_every``."""
        if trio.current_time() - self._view_at > self.status_every:
            await self.refresh()
            if self._machine is None:
                await self._refresh_machine()
        return self.view_json()

    def view_json(self) -> bytes:
        """``{"now": <wall clock>, "view": ...}``: the page keeps its clocks by the server's."""
        return b'{"now":%.3f,"view":%s}' % (time.time(), self._view or b"null")

    def view_message(self) -> bytes:
        return wire.event("view", self.view_json())

    def series_json(self) -> bytes:
        return wire.encode({"interval": self.sample_interval, "series": self.book.as_wire()})

    # ------------------------------------------------------------ traffic history

    async def _sampler(self) -> None:
        while True:
            await trio.sleep(self.sample_interval)
            await self.sample()

    async def sample(self) -> None:
        """One reading of every model's counters into the history; pages get the new points."""
        try:
            reply = await self.broker.request(p.Status(), timeout=2.0)
        except (Unreachable, ControlError):
            return  # no reading: a daemon restart is a gap, not the end of the history
        if not isinstance(reply, p.StatusReply):
            return
        engines = list(reply.engines)
        scrapable = [e for e in engines if e.state == S.READY and "--enable-metrics" in e.argv]
        scraped = await scrape_engines(
            self.upstream, scrapable, path=probe_path("/metrics").encode("ascii")
        )
        engine_sums = {alias: series.exposition_sums(text) for alias, text in scraped}
        aliases = [e.alias for e in engines]
        frontend = series.frontend_totals(_samples(self.metrics), aliases)
        totals = {a: series.totals_of(frontend[a], engine_sums.get(a)) for a in aliases}
        points = self.book.add(time.time(), totals)
        if points and self.viewers:
            wire_points = {alias: pt.as_list() for alias, pt in points.items()}
            self._broadcast(wire.event("sample", wire.encode(wire_points)))

    # ------------------------------------------------------------ one-off questions

    async def logs(self, alias: str, lines: int) -> tuple[list[str], int]:
        """The tail and the log's line count when it was read (``LogsReply.upto``)."""
        reply = await self.broker.request(p.Logs(alias=alias, lines=lines), timeout=5.0)
        if not isinstance(reply, p.LogsReply):
            return [], 0
        return list(reply.lines), reply.upto

    async def plan(self, alias: str) -> dict[str, Any]:
        """The dry-run and memory estimate of loading ``alias`` now (shared briefly)."""
        hit = self._plans.get(alias)
        now = trio.current_time()
        if hit is not None and now - hit[0] < PLAN_TTL:
            return hit[1]
        reply = await self.broker.request(p.Load(alias=alias, dry_run=True), timeout=PLAN_TIMEOUT)
        plan = view.redact_plan(reply.plan) if isinstance(reply, p.PlanReply) else {}
        if len(self._plans) > 64:
            self._plans.clear()
        self._plans[alias] = (trio.current_time(), plan)
        return plan


def _samples(metrics: Metrics) -> Iterable[series.Sample]:
    for collector in (metrics.requests, metrics.ttfb):
        for family in collector.collect():
            for s in family.samples:
                yield s.name, s.labels, float(s.value)
