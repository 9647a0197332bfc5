"""The engine pool: the engines' registry, the host they run in, and the glue.

The pool never touches an engine's processes: it sets desires on engines and waits
for their supervisors (``ktd.daemon.engine.supervisor``). What decides over time lives in
pure machines, each carried out by one module here: admission (``gate``),
placement and swaps (``placer``), idle expiry (``sweeper``), reload (``reloader``),
the state file and adoption (``persist``), the claim table (``claimtable``). The
control API's operations on the engines (load, evict, sleep, wake, status, logs) are
``ktd.daemon.pool.controls``'s: they wait on one request's behalf, the pool never does.
Leases and claims stay here: the gate and the claim table they go through are the
pool's own. Lookups raise ``ControlError`` (``ktd.control.errors``) with a stable code.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import httpx
import trio

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import fit, loglines
from ktd.core import states as S
from ktd.core.claimsync import Restored, may_hold
from ktd.core.command import build_env
from ktd.core.config import Config, ModelSpec
from ktd.core.lifecycle import Want
from ktd.core.loads import EngineLoad
from ktd.core.placement import Plan
from ktd.core.sglang_options import SGLangOptions
from ktd.core.topology import Topology
from ktd.daemon.engine import memory
from ktd.daemon.engine.engine import Engine, PlacementLike
from ktd.daemon.engine.key import KeyDir
from ktd.daemon.engine.launcher import Launcher, ProcessLauncher
from ktd.daemon.engine.probe import Prober, ProbeResult
from ktd.daemon.engine.supervisor import Supervisor
from ktd.daemon.offload import Offload, to_thread
from ktd.daemon.pool import statefile
from ktd.daemon.pool.claimtable import ClaimTable, claim_side
from ktd.daemon.pool.gate import Gatekeeper
from ktd.daemon.pool.loadhistory import LoadHistory
from ktd.daemon.pool.persist import Persister
from ktd.daemon.pool.placer import Placer
from ktd.daemon.pool.reloader import Reloader
from ktd.daemon.pool.statekeeper import StateKeeper
from ktd.daemon.pool.sweeper import Sweeper
from ktd.daemon.pool.usage import UsageStore
from ktd.protocol import EngineInfo, ErrorCode, Event

log = logging.getLogger("ktd")


Publisher = Callable[[str, Event], None]


class PoolObserver(Protocol):
    """Who follows engine changes from outside the pool (the gateway sync)."""

    def engine_changed(self, engine: Engine) -> None: ...

    async def before_drain(self, engine: Engine) -> bool: ...  # True: every router confirmed

    @property
    def routes_engines(self) -> bool: ...

    def annotate(self, info: EngineInfo) -> None: ...


# Environment ktd must not hand to engines.
_PRIVATE_ENV = ("KTD_SOCKET", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")


def settled(engine: Engine) -> EngineInfo:
    """A load's answer once it settled: the engine ready, or the error its end deserves
    (``load``, and an autoloading lease's wait in the gate)."""
    if engine.state == S.READY:
        return engine.info()
    info = engine.info(tail=40)
    detail: dict[str, Any] = {
        "reason": engine.reason,
        "log_tail": info.log_tail,
        "state": engine.state,
    }
    if engine.state == S.FAILED:
        detail["retry_after"] = engine.retry_in()
    why = engine.reason or (
        "stopped before it was ready: an evict, a reload or ktd's shutdown ended the load"
        if engine.state == S.STOPPED
        else engine.state
    )
    if engine.error_code == ErrorCode.BUSY:
        raise ControlError(ErrorCode.BUSY, f"{engine.alias}: {why}", detail)
    raise ControlError(ErrorCode.LOAD_FAILED, f"{engine.alias}: {why}", detail)


class Pool:
    def __init__(
        self,
        config: Config,
        *,
        log_dir: Path,
        publish: Publisher,
        state_path: Path | None = None,
        offload: Offload = to_thread,
        launcher: Launcher | None = None,
    ) -> None:
        self.config = config
        self.launcher = launcher or ProcessLauncher()  # how engines start (tests: in-process)
        self.offload = offload  # blocking work off the trio thread (``ktd.daemon.offload``)
        self.settings = config.daemon
        self.log_dir = log_dir
        self.publish = publish
        self.state_path = state_path
        self._open_state_dir(state_path, log_dir)
        self.prober = Prober()
        self.http: httpx.AsyncClient = httpx.AsyncClient(trust_env=False)
        self.base_env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        self.engines: dict[str, Engine] = {}
        self._wire_machines(config, offload)
        self.keeping_engines = False
        self.shutting_down = False
        self.observers: list[PoolObserver] = []
        self._nursery: trio.Nursery | None = None
        self._pending: list[Supervisor] = [self._new_engine(spec) for spec in config.served()]

    def _open_state_dir(self, state_path: Path | None, log_dir: Path) -> None:
        """What this daemon keeps beside its state file (none of it without one, in tests)."""
        # Without a state file a pool has no identity to keep: one of its own, so that its
        # adoption never takes (or kills) the marked engines of another (tests run many).
        self.instance = (
            statefile.instance_key(state_path.parent)
            if state_path
            else f"ktd-{os.getpid()}-{id(self):x}"
        )
        # The engines' key files (``ktd.daemon.engine.key``): beside the state, in a dir
        # of this daemon's own (the state dir is locked to one daemon).
        self.key_dir = KeyDir((state_path.parent if state_path else log_dir) / "keys")
        self.keeper = (
            StateKeeper(state_path, self.snapshot, on_error=self._state_error)
            if state_path is not None
            else None
        )
        self.load_history = LoadHistory(
            state_path.parent / "load_history.json" if state_path else None
        )
        self.usage = UsageStore(state_path.parent / "usage.json" if state_path else None)

    def _wire_machines(self, config: Config, offload: Offload) -> None:
        """The carriers of the pure machines, wired to each other and to the pool: the
        claim table, idle expiry, admission, placement, the state file, reload."""
        self._claims = ClaimTable(on_change=self._claim_changed)
        self._sweeper = Sweeper(
            self.engines,
            config.daemon.lease_ttl,
            expire=self._expire,
            recall_idle=lambda e, ttl: self._claims.recall(e, kind="idle", idle=ttl, reason="ttl"),
            engine_load=self._engine_load,
        )
        self._gate = Gatekeeper(
            self._claims,
            heard=self._sweeper.heard,
            on_lease=self._lease_event,
            settle=settled,
            known=lambda: sorted(a for a, e in self.engines.items() if not e.retired),
        )
        self._placer = Placer(
            self.engines,
            lambda: self.settings,
            ticket=self._gate.ticket,
            update=self._gate.update,
            recall=lambda e, why: self._claims.recall(e, reason=why),
            offload=offload,
        )
        self._persister = Persister(
            self.engines,
            state_path=self.state_path,
            instance=self.instance,
            restore_claims=self._restore_claims,
            key_dir=self.key_dir,
        )
        self._reloader = Reloader(
            self.engines,
            add_engine=self.add_engine,
            start_soon=self.start_soon,
            recall_idle=lambda e, why: self._claims.recall(e, kind="idle", idle=0.0, reason=why),
            forget_probes=self.prober.forget,
        )

    def _new_engine(self, spec: ModelSpec) -> Supervisor:
        engine = self.engines[spec.alias] = Engine(spec, self)
        return Supervisor(engine, self.launcher)

    def add_engine(self, spec: ModelSpec) -> None:
        """A model added (or replaced) by a reload: a new engine with its supervisor."""
        supervisor = self._new_engine(spec)
        if self._nursery is not None:
            self._nursery.start_soon(supervisor.run)
        else:
            self._pending.append(supervisor)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.http, trio.open_nursery() as nursery:
            self._nursery = nursery
            for supervisor in self._pending:
                nursery.start_soon(supervisor.run)
            self._pending = []
            nursery.start_soon(self._sweeper.run)
            if self.keeper is not None:
                nursery.start_soon(self.keeper.run)
            for engine in self._persister.restart_later:
                nursery.start_soon(self._reloader.restart_when_idle, engine)
            task_status.started()
            await trio.sleep_forever()

    async def stop_all(self, *, force: bool = False) -> None:
        """Daemon shutdown: every engine drained and torn down like an evict."""
        self.shutting_down = True
        engines = list(self.engines.values())
        for engine in engines:
            engine.request_down(force=force)
        for engine in engines:
            await engine.wait_stopped()

    def adopt(self) -> tuple[list[str], list[int]]:
        return self._persister.adopt()

    def apply_config(self, new: Config) -> str:
        summary = self._reloader.apply({s.alias: s for s in new.served()})
        self.config = new
        self.settings = new.daemon
        return summary

    def _restore_claims(self, engine: Engine, claims: Iterable[Restored]) -> None:
        for client in self._claims.restore(engine, claims):
            self._sweeper.heard(client)  # its holder has lease_ttl from now to report

    # ------------------------------------------------------------ EngineHost

    @property
    def closing(self) -> bool:
        return self.shutting_down

    async def place(self, engine: Engine) -> PlacementLike | None:
        return await self._placer.place(engine)

    def state_changed(self, engine: Engine) -> None:
        topic = f"engine.{engine.alias}"
        self.publish(topic, Event(topic=topic, time=time.time(), **engine.moment()))
        if engine.claims and not may_hold(claim_side(engine)):
            self._claims.revoke(engine)  # crashed, force-stopped: nothing to give back
        # Written at once, not batched: a kill -9 right after this change must find it.
        self.save_state()
        for observer in self.observers:
            observer.engine_changed(engine)

    def engine_changed(self, engine: Engine) -> None:
        self._gate.update(engine)
        self._sweeper.wake()
        self._placer.poke()

    async def before_drain(self, engine: Engine) -> bool:
        """Traffic off: the frontends stop routing to it now (the drain waits for their
        claims), the routers are told. True when every router confirmed."""
        why = engine.down_reason or ("going to sleep" if engine.want == Want.ASLEEP else "stopping")
        self._claims.recall(engine, reason=why)
        confirmed = True
        for observer in self.observers:
            confirmed = await observer.before_drain(engine) and confirmed
        return confirmed

    async def make_room(self, engine: Engine) -> str | None:
        return await self._placer.make_room(engine)

    @property
    def engine_drain(self) -> bool:
        return any(o.routes_engines for o in self.observers)

    def loaded(self, engine: Engine, seconds: float) -> None:
        self.load_history.record(engine.alias, seconds)
        engine.stats.owed = False  # the swap worked: nothing to bring back

    def load_failed(self, engine: Engine) -> None:
        """A launch failed before ready: bring back what it stopped to make room."""
        back = self._placer.bring_back(engine)
        if back:
            engine.reason = f"{engine.reason}; started {', '.join(back)} again"
            engine.log.note(f"started {', '.join(back)} again, stopped for this load")

    def engine_keys(self) -> dict[str, str]:
        """URL -> API key of every engine that has both (``EngineKeys``)."""
        return {
            engine.url_for(run): run.api_key
            for engine in self.engines.values()
            if (run := engine.run) is not None and run.api_key
        }

    def expected_load(self, alias: str) -> float | None:
        return self.load_history.expected(alias)

    def log_lines(self, engine: Engine, lines: list[str]) -> None:
        keep, probes = loglines.split_probe_access(lines)
        now = time.time()
        for kind, batch in (("log", keep), ("probe", probes)):
            if batch:
                topic = f"{kind}.{engine.alias}"
                self.publish(
                    topic,
                    Event(
                        topic=topic,
                        time=now,
                        alias=engine.alias,
                        lines=batch,
                        upto=engine.log.count,
                    ),
                )

    def _lease_event(self, engine: Engine) -> None:
        topic = f"lease.{engine.alias}"
        self.publish(
            topic,
            Event(topic=topic, time=time.time(), alias=engine.alias, in_flight=engine.in_flight()),
        )
        engine.notify_changed()

    def _claim_changed(self, engine: Engine, persist_now: bool) -> None:
        self._lease_event(engine)
        if persist_now:
            self.save_state()  # claims are rare (one per engine and frontend): at once

    async def _engine_load(self, engine: Engine) -> EngineLoad | None:
        url, run = engine.url, engine.run
        if url is None or run is None:
            return None
        return await memory.read_load(self.http, url, key=run.api_key)

    def _expire(self, clients: frozenset[str]) -> None:
        self._gate.release_clients(clients)
        self._claims.expire(clients)
        self.usage.holds.forget(clients)

    # ------------------------------------------------------------ state file

    def snapshot(self) -> statefile.StateFile:
        return self._persister.snapshot()

    def save_state(self) -> None:
        if self.keeper is not None:
            self.keeper.save()

    def _state_error(self, message: str) -> None:
        self.publish("daemon", Event(topic="daemon", time=time.time(), alias="", reason=message))

    # ------------------------------------------------------------ lookups

    def engine(self, alias: str) -> Engine:
        engine = self.engines.get(alias)
        if engine is not None:
            return engine
        spec = self.config.models.get(alias)
        if spec is not None and not spec.served:
            raise ControlError(
                ErrorCode.NOT_KT,
                f"{alias!r} is configured but not served by ktd: {spec.not_served_reason}",
                {"backend": spec.backend},
            )
        raise ControlError(
            ErrorCode.UNKNOWN_MODEL,
            f"unknown model {alias!r}; ktd serves: {', '.join(sorted(self.engines)) or 'nothing'}",
            {"models": sorted(self.engines)},
        )

    # ------------------------------------------------------------ placement, for others

    @property
    def topology(self) -> Topology:
        return self._placer.topology

    def refresh_topology(self, topo: Topology) -> None:
        self._placer.refresh_topology(topo)

    def plan(
        self,
        spec: ModelSpec,
        *,
        exclude: Engine | None = None,
        catalog: SGLangOptions | None = None,
    ) -> Plan:
        """Where ``spec`` would go now (``LaunchError`` if nowhere): dry runs, doctor."""
        return self._placer.make_plan(spec, exclude=exclude, catalog=catalog)

    async def fit(self, spec: ModelSpec, plan: Plan) -> tuple[fit.Estimate, fit.Fit]:
        """Its memory estimate against the box (off the event loop)."""
        return await self._placer.fit(spec, plan)

    async def probe(self, spec: ModelSpec) -> ProbeResult:
        """What the engine's interpreter has (cached): for dry-runs, as launches see it."""
        return await self.prober.probe(spec.python, build_env(spec, self.base_env))

    # ------------------------------------------------------------ for the control operations

    def check_open(self) -> None:
        """New loads, sleeps, wakes and leases are refused once shutdown began."""
        if self.shutting_down:
            raise ControlError(ErrorCode.SHUTTING_DOWN, "ktd is shutting down")

    # ------------------------------------------------------------ leases and claims

    def heartbeat(self, client: str) -> None:
        self._sweeper.heard(client)

    async def acquire(
        self,
        model: str,
        client: str,
        *,
        autoload: bool = True,
        timeout: float | None = None,
        claim: bool = False,
    ) -> tuple[str, Engine]:
        """A lease (or, with ``claim``, a frontend's standing claim) on ``model``'s engine."""
        engine = self.engine(model)
        self.check_open()
        granted = await self._gate.acquire(
            engine, client, claim=claim, autoload=autoload, timeout=timeout
        )
        return granted, engine

    def grant_now(
        self, model: str, client: str, *, claim: bool, pid: int | None = None
    ) -> tuple[str, Engine] | None:
        """A lease or claim (which keeps its sender's ``pid``) granted in the socket
        pump's pass, or None (it must wait)."""
        self._claims.heard_from(client, pid if claim else None)
        engine = self.engines.get(model)
        if engine is None or self.shutting_down:
            return None
        granted = self._gate.grant_now(engine, client, claim=claim)
        return None if granted is None else (granted, engine)

    def release(self, lease_id: str) -> bool:
        return self._gate.release(lease_id)

    def sync(self, msg: p.Sync, pid: int | None = None) -> p.SyncReply | None:
        """Record a frontend's report (its heartbeat too; ``pid``: the sender's, from the
        socket); the reply now, or None to park it."""
        self.heartbeat(msg.client)
        self._claims.heard_from(msg.client, pid)
        if self.usage.report(msg.client, msg.usage_seq, msg.usage, msg.reserved):
            self._claims.wake_others(msg.client)  # its holds changed: the others reserve around
        self._claims.report(msg, self.engines)
        for e in self.engines.values():
            queued = self._claims.queued_for(e.alias)
            e.remote_since = self._claims.queued_since(e.alias)
            if queued != e.remote_queued:
                e.remote_queued = queued
                e.notify_changed()
        if msg.wait <= 0 or self._claims.has_news(msg.client):
            return self.sync_reply(msg.client)
        return None

    def sync_reply(self, client: str) -> p.SyncReply:
        limits = {
            e.alias: p.Limits(max_concurrent=e.spec.max_concurrent, max_queue=e.spec.max_queue)
            for e in self.engines.values()
            if e.spec.max_concurrent is not None or e.spec.max_queue is not None
        }
        reply = self._claims.sync_reply(client, limits)
        self.usage.answer(client, reply)
        return reply

    def claim_reply(self, claim: str) -> p.ClaimReply:
        return self._claims.reply_for(claim)

    async def park(self, client: str, wait: float) -> None:
        """Hold a frontend's long poll until there is news for it, or ``wait`` is over."""
        await self._claims.park(client, wait)

    def give_back(self, client: str, claim: str) -> bool:
        self.heartbeat(client)
        return self._claims.give_back(client, claim)
