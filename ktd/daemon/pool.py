"""The engine pool: routing, placement, leases, TTL, and the operations of the control API.

The pool never touches an engine's processes: it sets desires on engines and
waits for their supervisors. Operations raise ``ControlError`` (``ktd.control.errors``)
with a stable code.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import trio

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import claims as claim_policy
from ktd.core import eviction, fit, loglines, placement
from ktd.core import states as S
from ktd.core.claims import may_hold
from ktd.core.command import ENGINE_MARK, build_env, planner_args
from ktd.core.config import Config, ModelSpec
from ktd.core.placement import Holding, Plan
from ktd.core.reload import EngineView, plan_reload
from ktd.core.sglang_options import Catalog
from ktd.core.topology import Topology
from ktd.daemon import adoption, proctree, statefile, weights
from ktd.daemon.claims import ClaimTable, claim_side
from ktd.daemon.engine import Busy, Engine, Lease, PlacementLike, Running, Unplaceable
from ktd.daemon.loadhistory import LoadHistory
from ktd.daemon.preflight import Refused
from ktd.daemon.probe import Prober, ProbeResult
from ktd.daemon.statekeeper import StateKeeper
from ktd.protocol import EngineInfo, ErrorCode, Event, ModelInfo
from ktd.topology import read_topology

log = logging.getLogger("ktd")


Publisher = Callable[[str, Event], None]


class PoolObserver(Protocol):
    """Who follows engine changes from outside the pool (the gateway sync)."""

    def engine_changed(self, engine: Engine) -> None: ...

    async def before_drain(self, engine: Engine) -> None: ...

    def annotate(self, info: EngineInfo) -> None: ...


# Environment ktd must not hand to engines.
_PRIVATE_ENV = ("KTD_SOCKET", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")


class Pool:
    def __init__(
        self,
        config: Config,
        *,
        log_dir: Path,
        publish: Publisher,
        state_path: Path | None = None,
    ) -> None:
        self.config = config
        self.settings = config.daemon
        self.log_dir = log_dir
        self.publish = publish
        self.state_path = state_path
        self.instance = statefile.instance_key(state_path.parent) if state_path else "ktd"
        self.keeper = (
            StateKeeper(state_path, self.snapshot, on_error=self._state_error)
            if state_path is not None
            else None
        )
        self.prober = Prober()
        self.http: httpx.AsyncClient = httpx.AsyncClient(trust_env=False)
        self.base_env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        self.engines: dict[str, Engine] = {}
        self.leases: dict[str, Engine] = {}
        self.clients: dict[str, float] = {}  # control client -> when last heard (trio clock)
        self.claims = ClaimTable(on_change=self._claim_changed)
        self.keeping_engines = False
        self.shutting_down = False
        self._place_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._topology: Topology | None = None
        self._ttl_wake = trio.Event()
        self._restart_after_adoption: list[Engine] = []
        self._tickets = itertools.count()  # arrival order of acquires, across engines
        self._changed = trio.Event()  # any engine's state or leases changed
        self.observers: list[PoolObserver] = []
        self.load_history = LoadHistory(
            state_path.parent / "load_history.json" if state_path else None
        )
        for spec in config.served():
            self.engines[spec.alias] = Engine(spec, self)

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.http, trio.open_nursery() as nursery:
            self._nursery = nursery
            for engine in self.engines.values():
                nursery.start_soon(engine.run_forever)
            nursery.start_soon(self._lease_sweeper)
            nursery.start_soon(self._ttl_sweeper)
            if self.keeper is not None:
                nursery.start_soon(self.keeper.run)
            for engine in self._restart_after_adoption:
                nursery.start_soon(self._restart_when_idle, engine)
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

    # ------------------------------------------------------------ EngineHost

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = read_topology(
                weights.machine_root(), nvidia_smi=weights.nvidia_smi_cmd()
            )
        return self._topology

    def refresh_topology(self, topo: Topology) -> None:
        self._topology = topo

    def holdings(self, exclude: Engine | None = None) -> list[Holding]:
        out = []
        for e in self.engines.values():
            if e is exclude or e.plan is None or e.state not in S.HOLDS_RESOURCES:
                continue
            out.append(
                Holding(
                    alias=e.alias,
                    numa_nodes=tuple(e.plan.numa_nodes),
                    gpus=tuple(e.plan.gpus),
                    leases=e.busy(),
                    pinned=e.spec.pinned,
                    last_used=e.last_used or e.since,
                    state=e.state,
                )
            )
        return out

    def make_plan(
        self, spec: ModelSpec, *, exclude: Engine | None = None, catalog: Catalog | None = None
    ) -> Plan:
        """The placement of ``spec`` given every other engine's holdings (pure given those).

        With ``catalog`` the user's flags are read as SGLang reads them (prefixes
        included); raises :class:`~ktd.core.command.LaunchError` for ones it would refuse.
        """
        return placement.plan(
            spec.alias,
            spec.numa,
            spec.gpus,
            planner_args(spec.extra_args, catalog),
            self.topology,
            self.holdings(exclude),
            tp_size=spec.tp_size,
            reserved_cpus=tuple(self.settings.cpus or ()),
            cpu_reserve=self.settings.cpu_reserve,
            single_engine=self.settings.one_engine_per_machine or len(self.engines) == 1,
            allow_evict=spec.swap,
        )

    async def fit(self, spec: ModelSpec, plan: Plan) -> tuple[fit.Estimate, fit.Fit]:
        """The memory estimate of ``spec`` on ``plan``, counting what its evictions free."""
        victims = [
            (v.spec, tuple(v.plan.numa_nodes), tuple(v.plan.gpus))
            for v in (self.engines.get(a) for a in plan.evict)
            if v is not None and v.plan is not None
        ]
        return await trio.to_thread.run_sync(
            weights.verdict,
            spec,
            tuple(plan.numa_nodes),
            tuple(plan.gpus),
            victims,
            tuple(plan.evict),
        )

    async def place(self, engine: Engine) -> PlacementLike | None:
        """Plan, evict idle engines in the way, or wait for busy ones to become idle.

        Queue, don't refuse: when the engines holding what ``engine`` needs are
        busy (leases, or still loading) but could be evicted once idle, the
        launch waits. Meanwhile those holders *yield*: requests that arrived
        before the wait began are still served there, later ones queue behind
        the swap. So the swap happens as soon as the holders are idle, and
        neither side starves: the holders' later requests bring them back the
        same way once ``engine`` is idle in turn. Pinned holders, or
        ``swap: false`` on ``engine``, make it a plain ``Busy``. Returns None when
        ``engine`` stopped being wanted while it waited.
        """
        yielded: list[tuple[Engine, int]] = []
        fitted = engine.spec.fit == "ignore"
        try:
            while True:
                async with self._place_lock:
                    plan = self.make_plan(engine.spec, exclude=engine, catalog=engine.catalog)
                    if plan.ok and not fitted:
                        # Once, before anything is evicted: after an eviction the victim's
                        # memory may take a while to show up as free.
                        fitted = True
                        _, verdict = await self.fit(engine.spec, plan)
                        if not verdict.ok:
                            raise Refused(f"{verdict.reason}; no engine was stopped")
                    views = {
                        a: holder_view(self.engines[a])
                        for a in plan.blocked_by
                        if a in self.engines
                    }
                    step = eviction.place_step(plan, views, swap=engine.spec.swap)
                    if isinstance(step, eviction.Use):
                        result: PlacementLike = plan
                        return result
                    if isinstance(step, eviction.Evict):
                        engine.set_phase(f"stopping {', '.join(step.aliases)} to make room")
                        engine.made_room += [a for a in step.aliases if a not in engine.made_room]
                        for alias in step.aliases:
                            victim = self.engines[alias]
                            why = f"evicted to make room for {engine.alias}"
                            victim.log.note(why)
                            victim.evictions += 1
                            victim.request_down(reason=why)
                        for alias in step.aliases:
                            await self.engines[alias].wait_stopped()
                        continue
                    if isinstance(step, eviction.WaitLeaving):
                        for alias in step.aliases:
                            await self.engines[alias].wait_stopped()
                        continue
                    if isinstance(step, eviction.Refuse):
                        if step.impossible:
                            raise Unplaceable(step.reason)
                        raise Busy(step.reason, step.blocked_by)
                    holders = [self.engines[a] for a in step.aliases]
                    cutoff = next(self._tickets)
                    for h in holders:
                        if h.yield_before is None:
                            h.yield_before = cutoff
                            yielded.append((h, cutoff))
                        # Frontends stop routing there now; their requests under way finish.
                        self.claims.recall(h, reason=f"yielding to {engine.alias}")
                names = ", ".join(h.alias for h in holders)
                engine.set_phase(f"waiting for {names}")
                engine.log.note(f"waiting for {names} to become idle")
                while engine.want_up and not all(
                    eviction.idle_for(holder_view(h), cutoff) for h in holders
                ):
                    changed = self._changed
                    with trio.move_on_after(1.0):  # belt and braces: re-check now and then
                        await changed.wait()
                if not engine.want_up:
                    return None
        finally:
            for h, cut in yielded:
                if h.yield_before == cut:
                    h.yield_before = None
                    h.notify_changed()

    def _poke_all(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def probe(self, spec: ModelSpec) -> ProbeResult:
        """What the engine's interpreter has (cached): for dry-runs, as launches see it."""
        return await self.prober.probe(spec.python, build_env(spec, self.base_env))

    def state_changed(self, engine: Engine) -> None:
        run = engine.run
        self.publish(
            f"engine.{engine.alias}",
            Event(
                topic=f"engine.{engine.alias}",
                time=time.time(),
                alias=engine.alias,
                state=engine.state,
                reason=engine.reason,
                pid=run.pid if run else None,
                port=run.port if run else None,
                phase=engine.phase,
                load_started=engine.load_started if engine.state == S.STARTING else None,
                load_eta=self.expected_load(engine.alias) if engine.state == S.STARTING else None,
            ),
        )
        if engine.claims and not may_hold(claim_side(engine)):
            self.claims.revoke(engine)  # crashed, force-stopped: nothing to give back
        self._ttl_wake.set()
        self._poke_all()
        # Written at once, not batched: a kill -9 right after this change must find it.
        self.save_state()
        for observer in self.observers:
            observer.engine_changed(engine)

    async def before_drain(self, engine: Engine) -> None:
        # The frontends stop routing to it now; the drain waits for their claims.
        self.claims.recall(engine, reason=engine.down_reason or "stopping")
        for observer in self.observers:
            await observer.before_drain(engine)

    def loaded(self, engine: Engine, seconds: float) -> None:
        self.load_history.record(engine.alias, seconds)

    def expected_load(self, alias: str) -> float | None:
        return self.load_history.expected(alias)

    def log_lines(self, engine: Engine, lines: list[str]) -> None:
        keep, probes = loglines.split_probe_access(lines)
        now = time.time()
        for kind, batch in (("log", keep), ("probe", probes)):
            if batch:
                topic = f"{kind}.{engine.alias}"
                self.publish(topic, Event(topic=topic, time=now, alias=engine.alias, lines=batch))

    def _lease_event(self, engine: Engine) -> None:
        topic = f"lease.{engine.alias}"
        self.publish(
            topic,
            Event(topic=topic, time=time.time(), alias=engine.alias, leases=engine.busy()),
        )
        self._ttl_wake.set()
        self._poke_all()

    def _claim_changed(self, engine: Engine, persist: bool) -> None:
        self._lease_event(engine)
        engine.notify_changed()
        if persist:
            self.save_state()  # claims are rare (one per engine and frontend): at once

    # ------------------------------------------------------------ state file and adoption

    def snapshot(self) -> statefile.StateFile:
        records = []
        for e in self.engines.values():
            run = e.run
            if run is None or e.state not in S.HOLDS_RESOURCES:
                continue
            plan = e.plan
            records.append(
                statefile.EngineRecord(
                    alias=e.alias,
                    pid=run.pid,
                    start=run.start,
                    engine_id=run.engine_id,
                    port=run.port,
                    argv=run.argv,
                    numa_nodes=list(plan.numa_nodes) if plan else [],
                    cpus=list(plan.cpus) if plan else [],
                    gpus=list(plan.gpus) if plan else [],
                    env=dict(plan.env) if plan else {},
                    since=e.since,
                    state=e.state,
                    started_at=run.started_at,
                    digest=run.digest,
                    claims=[
                        statefile.ClaimRecord(id=c.id, client=c.client) for c in e.claims.values()
                    ],
                )
            )
        return statefile.StateFile(daemon_pid=os.getpid(), engines=records)

    def save_state(self) -> None:
        if self.keeper is not None:
            self.keeper.save()

    def _state_error(self, message: str) -> None:
        self.publish(
            "daemon",
            Event(topic="daemon", time=time.time(), alias="", reason=message),
        )

    def adopt(self) -> tuple[list[str], list[int]]:
        """Take over the engines a previous daemon left running; kill what cannot be adopted.

        Ownership is the engine marker in each process's environment (``ktd.daemon.adoption``);
        the state file only adds how each was placed. Call before ``run()``.
        Returns (adopted aliases, killed pids).
        """
        records: list[statefile.EngineRecord] = []
        if self.state_path is not None:
            loaded = statefile.load(self.state_path)
            if loaded.problem:
                log.error(
                    "%s; engines are recognised by their marker alone this time", loaded.problem
                )
            records = loaded.state.engines
        found = adoption.scan(self.instance)
        decision = adoption.decide(records, found, set(self.engines))
        for ignored, why in decision.ignored:
            log.warning(
                "state file names %s (pid %d) but %s: not adopted, not signalled",
                ignored.alias,
                ignored.pid,
                why,
            )
        adopted: list[str] = []
        for f, rec in decision.adopt:
            engine = self.engines[f.alias]
            if self._adopt_one(engine, f, rec):
                adopted.append(f.alias)
        killed: list[int] = []
        for f, why in decision.kill:
            pids = adoption.kill(f)
            if pids:
                log.warning("killed engine %s (pids %s): %s", f.engine_id, pids, why)
            killed += pids
        return adopted, killed

    def _adopt_one(
        self, engine: Engine, f: adoption.Found, rec: statefile.EngineRecord | None
    ) -> bool:
        try:
            pidfd: int | None = os.pidfd_open(f.pid)
        except OSError:
            pidfd = None
        if not (
            proctree.owned_by_us(f.pid) and proctree.environ_has(f.pid, ENGINE_MARK, f.engine_id)
        ):
            # Gone (or replaced) since the scan: nothing to adopt, nothing to kill.
            if pidfd is not None:
                os.close(pidfd)
            return False
        if rec is not None:
            digest, state = rec.digest, rec.state
            started_at = rec.started_at or rec.since
            port, argv = rec.port, list(rec.argv)
            plan = FixedPlacement(
                numa_nodes=tuple(rec.numa_nodes),
                cpus=tuple(rec.cpus),
                gpus=tuple(rec.gpus),
                env=dict(rec.env),
            )
        else:
            # No record (lost to a failed write, or corrupt): what the process itself says.
            # Unknown state: it gets a fresh health_timeout to answer (a ready one does at
            # once), rather than being judged by a deadline computed from a guess.
            digest = f.digest or engine.spec.launch_digest()
            state, started_at = None, time.time()
            port, argv = f.port or 0, list(f.argv)
            plan = FixedPlacement(
                numa_nodes=f.numa_nodes,
                cpus=f.cpus,
                gpus=f.gpus,
                env={} if f.gpus_env is None else {"CUDA_VISIBLE_DEVICES": f.gpus_env},
            )
            log.warning(
                "recovered engine %s (pid %d, port %d) without a state record",
                f.alias,
                f.pid,
                port,
            )
        engine.log.adopt_output(f.pid)
        engine.adopt = Running(
            digest=digest,
            adopted_state=state,
            started_at=started_at,
            pid=f.pid,
            start=f.start,
            engine_id=f.engine_id,
            port=port,
            argv=argv,
            pidfd=pidfd,
        )
        engine.plan = plan  # type: ignore[assignment]
        if rec is not None and rec.claims:
            now = trio.current_time()
            for client in self.claims.restore(engine, ((c.id, c.client) for c in rec.claims)):
                self.clients[client] = now  # their holder has lease_ttl from now to report
        if digest != engine.spec.launch_digest():
            # The config changed while no ktd watched: restart it when idle,
            # as a reload would have.
            engine.pending_spec = engine.spec
            engine.stale = True
            self._restart_after_adoption.append(engine)
        return True

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

    def status(self, alias: str | None = None) -> list[EngineInfo]:
        if alias is not None:
            infos = [self.engine(alias).info(tail=20)]
        else:
            infos = [e.info(tail=20 if e.state == S.FAILED else 0) for e in self.engines.values()]
        for observer in self.observers:
            for info in infos:
                observer.annotate(info)
        return infos

    def models(self) -> list[ModelInfo]:
        out = []
        for spec in self.config.models.values():
            engine = self.engines.get(spec.alias)
            out.append(
                ModelInfo(
                    alias=spec.alias,
                    backend=spec.backend,
                    served=spec.served,
                    path=spec.path,
                    state=engine.state if engine else "not served",
                    reason=engine.reason if engine else spec.not_served_reason,
                )
            )
        return out

    # ------------------------------------------------------------ load / evict

    def _check_open(self) -> None:
        if self.shutting_down:
            raise ControlError(ErrorCode.SHUTTING_DOWN, "ktd is shutting down")

    async def load(
        self, alias: str, *, wait: bool = True, timeout: float | None = None
    ) -> EngineInfo:
        engine = self.engine(alias)
        self._check_open()
        if engine.state in (S.DRAINING, S.STOPPING):
            # An evict is under way: let it finish, then start afresh.
            await engine.wait_stopped()
        engine.request_up()
        if not wait:
            # Answer once the supervisor has taken the request, so the reply says "starting".
            await engine.wait_until(
                lambda: engine.state not in (S.STOPPED, S.FAILED) or not engine.want_up, 5.0
            )
            return engine.info()
        limit = math.inf if timeout is None or timeout <= 0 else timeout
        if not await engine.wait_until(engine.load_settled, limit):
            raise ControlError(
                ErrorCode.TIMEOUT,
                f"{alias} not ready after {limit:g}s (still {engine.state}; the load goes on)",
                {"state": engine.state},
            )
        return self._settled(engine)

    def _settled(self, engine: Engine) -> EngineInfo:
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
        if engine.error_code == ErrorCode.BUSY:
            raise ControlError(ErrorCode.BUSY, f"{engine.alias}: {engine.reason}", detail)
        raise ControlError(ErrorCode.LOAD_FAILED, f"{engine.alias}: {engine.reason}", detail)

    async def evict(
        self,
        alias: str | None,
        *,
        all: bool = False,
        force: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        if all:
            targets = list(self.engines.values())
        elif alias is not None:
            targets = [self.engine(alias)]
        else:
            raise ControlError(ErrorCode.BAD_REQUEST, "evict needs an alias or all=true")
        evicted = []
        for engine in targets:
            if engine.state in S.HOLDS_RESOURCES or engine.want_up:
                engine.request_down(force=force, drain_timeout=timeout)
                evicted.append(engine.alias)
        for engine in targets:
            await engine.wait_stopped()
        return evicted

    def logs(self, alias: str, lines: int, *, probes: bool = False) -> list[str]:
        """The last ``lines`` lines; ktd's own health-check access lines only if ``probes``."""
        engine = self.engine(alias)
        engine.log.poll()
        n = max(0, min(lines, 100_000))
        if probes:
            return engine.log.last(n)
        keep = [ln for ln in engine.log.tail if not loglines.is_probe_access(ln)]
        return keep[-n:] if n else []

    # ------------------------------------------------------------ leases

    def heartbeat(self, client: str) -> None:
        self.clients[client] = trio.current_time()

    async def acquire(
        self,
        model: str,
        client: str,
        *,
        autoload: bool = True,
        timeout: float | None = None,
        claim: bool = False,
    ) -> tuple[str, Engine]:
        """A lease on ``model``'s engine: at once, or after a load, a swap or a free slot.

        Requests wait in arrival order (one ticket each) for the engine to be ready,
        not yielding to another engine's swap, and below ``max_concurrent``; at most
        ``max_queue`` wait (``queue_full`` beyond, HTTP 429). A failed engine is
        retried by the first request after its backoff (``Engine.retry_delay``);
        before that, requests get ``load_failed`` with ``retry_after``.

        ``claim``: a frontend's standing claim instead of a lease (the id of
        either comes back). A claim stands for any number of requests; their
        frontend applies ``max_concurrent``/``max_queue`` to them itself.
        """
        engine = self.engine(model)
        self._check_open()
        self.heartbeat(client)
        if self.ready_engine(model, claim=claim) is engine:
            return self._grant(engine, client, claim), engine
        limit_q = engine.spec.max_queue
        if not claim and limit_q is not None and len(engine.queue) >= limit_q:
            raise ControlError(
                ErrorCode.QUEUE_FULL,
                f"{len(engine.queue)} request(s) already waiting (max_queue {limit_q})",
                {"queued": len(engine.queue), "retry_after": 1.0},
            )
        ticket = next(self._tickets)
        engine.queue.append(ticket)
        engine.claim_waits += claim
        engine.notify_changed()
        limit = math.inf if timeout is None or timeout <= 0 else timeout
        try:
            with trio.move_on_after(limit):
                return await self._wait_turn(engine, ticket, client, autoload, claim)
            raise ControlError(
                ErrorCode.TIMEOUT,
                f"{model} not ready after {limit:g}s (still {engine.state}; the load goes on)",
                {"state": engine.state},
            )
        finally:
            engine.claim_waits -= claim
            if ticket in engine.queue:
                engine.queue.remove(ticket)
            engine.notify_changed()
            self._poke_all()

    async def _wait_turn(
        self, engine: Engine, ticket: int, client: str, autoload: bool, claim: bool
    ) -> tuple[str, Engine]:
        started = False  # this request asked for a launch
        while True:
            self._check_open()
            if engine.retired:
                raise ControlError(
                    ErrorCode.UNKNOWN_MODEL,
                    f"{engine.alias} was removed from the config while the request waited",
                    {"models": sorted(a for a, e in self.engines.items() if not e.retired)},
                )
            state = engine.state
            if state == S.READY:
                if (
                    engine.queue
                    and engine.queue[0] == ticket
                    and (claim or engine.has_slot())
                    and (engine.yield_before is None or ticket < engine.yield_before)
                ):
                    return self._grant(engine, client, claim), engine
            elif state in (S.STOPPED, S.FAILED) and not engine.want_up:
                if started:
                    # The attempt this request started ended without ready (failed,
                    # busy, or stopped by an evict): say so rather than start another.
                    self._settled(engine)
                if not autoload:
                    raise ControlError(
                        ErrorCode.NOT_LOADED,
                        f"{engine.alias} is not loaded (state {state}); "
                        f"run: ktctl load {engine.alias}",
                        {"state": state},
                    )
                if state == S.FAILED and engine.retry_in() > 0:
                    wait = engine.retry_in()
                    raise ControlError(
                        ErrorCode.LOAD_FAILED,
                        f"{engine.alias} failed: {engine.reason}; the next request after "
                        f"{wait:.0f}s retries it (or run `ktctl load {engine.alias}`)",
                        {
                            "reason": engine.reason,
                            "log_tail": engine.log.last(20),
                            "retry_after": wait,
                        },
                    )
                engine.request_up()
                started = True
            await engine.wait_changed()

    def ready_engine(self, model: str, *, claim: bool = False) -> Engine | None:
        """The engine for ``model`` if a lease (or claim) can be granted at once:
        ready, nobody queued before us, not yielding to a swap, below max_concurrent
        (a lease; a claim's frontend counts its own requests)."""
        engine = self.engines.get(model)
        if engine is None or engine.state != S.READY or self.shutting_down:
            return None
        if engine.queue or engine.yield_before is not None:
            return None
        if not claim and not engine.has_slot():
            return None
        return engine

    def _grant(self, engine: Engine, client: str, claim: bool) -> str:
        return self.grant_claim(engine, client) if claim else self.grant(engine, client)

    def grant_claim(self, engine: Engine, client: str) -> str:
        self.heartbeat(client)
        return self.claims.grant(engine, client)

    def grant(self, engine: Engine, client: str) -> str:
        # Seen now: during a long load the sweeper may have dropped the client, and a
        # lease of a client it no longer tracks would never expire.
        self.heartbeat(client)
        lease = Lease(id=secrets.token_hex(8), client=client)
        engine.add_lease(lease)
        self.leases[lease.id] = engine
        self._lease_event(engine)
        return lease.id

    def release(self, lease_id: str) -> bool:
        engine = self.leases.pop(lease_id, None)
        if engine is None:
            return False
        engine.drop_lease(lease_id)
        self._lease_event(engine)
        return True

    async def _lease_sweeper(self) -> None:
        """Leases and claims of a client that stopped sending heartbeats expire (it died).

        Judged only when the daemon itself ran meanwhile (``ktd.core.claims.sweep``):
        after a SIGSTOP the heartbeats sent during the pause are still unread.
        """
        last = trio.current_time()
        while True:
            ttl = max(self.settings.lease_ttl, 0.5)
            await trio.sleep(ttl / 3)
            now = trio.current_time()
            verdict = claim_policy.sweep(self.clients, now, ttl, last)
            last = now
            if verdict.paused:
                log.warning(
                    "the daemon did not run for a while (stopped or starved): every "
                    "client gets a fresh lease_ttl before its leases or claims expire"
                )
                for c in self.clients:
                    self.clients[c] = now
                continue
            if not verdict.dead:
                continue
            for lease_id, engine in list(self.leases.items()):
                lease = engine.leases.get(lease_id)
                if lease is not None and lease.client in verdict.dead:
                    self.release(lease_id)
            self.claims.expire(verdict.dead)
            for c in verdict.dead:
                del self.clients[c]

    # ------------------------------------------------------------ claims

    def sync(self, msg: p.Sync) -> p.SyncReply | None:
        """Record a frontend's report (its heartbeat too); the reply now, or None to park it."""
        self.heartbeat(msg.client)
        self.claims.report(msg, self.engines)
        for e in self.engines.values():
            e.remote_queued = self.claims.queued_for(e.alias)
        if msg.wait <= 0 or self.claims.has_news(msg.client):
            return self.sync_reply(msg.client)
        return None

    def sync_reply(self, client: str) -> p.SyncReply:
        limits = {
            e.alias: p.Limits(max_concurrent=e.spec.max_concurrent, max_queue=e.spec.max_queue)
            for e in self.engines.values()
            if e.spec.max_concurrent is not None or e.spec.max_queue is not None
        }
        return self.claims.sync_reply(client, limits)

    def give_back(self, client: str, claim: str) -> bool:
        self.heartbeat(client)
        return self.claims.give_back(client, claim)

    async def _ttl_sweeper(self) -> None:
        """Idle TTL: counted from the end of the last request, never while a lease is held."""
        while True:
            now = time.time()
            next_due = math.inf
            for e in self.engines.values():
                due = e.expires_at()
                if due is None:
                    continue
                ttl = e.spec.ttl
                if due <= now and e.claims:
                    # Frontends hold it: they give it back only if really idle that long.
                    self.claims.recall(e, kind="idle", idle=ttl, reason="ttl")
                elif due <= now:
                    e.log.note(f"idle for {ttl:g}s (ttl): evicting")
                    e.request_down(reason=f"idle for {ttl:g}s (ttl)")
                else:
                    next_due = min(next_due, due)
            self._ttl_wake = trio.Event()
            with trio.move_on_after(max(0.05, next_due - time.time())):
                await self._ttl_wake.wait()

    # ------------------------------------------------------------ reload

    def apply_config(self, new: Config) -> str:
        """Hot reload without llama-swap's habit of restarting everything.

        Engines whose launch is unchanged keep running untouched (their
        lifecycle fields update in place); changed ones restart when idle, or
        are flagged ``stale`` until their last lease ends; removed ones drain
        and stop; new ones appear stopped.
        """
        self.prober.forget()  # a venv may have been upgraded: the next launch probes again
        views = {
            alias: EngineView(
                spec=e.spec,
                state=e.state,
                leases=e.busy(),
                retired=e.retired,
                finished=e.finished,
                restart_pending=e.pending_spec is not None,
            )
            for alias, e in self.engines.items()
        }
        plan = plan_reload(views, {s.alias: s for s in new.served()})
        for change in plan.changes:
            self._apply_change(change.alias, change.kind, change.spec, change.schedule_restart)
        self.config = new
        self.settings = new.daemon
        return plan.summary()

    def _apply_change(
        self, alias: str, kind: str, spec: ModelSpec | None, schedule_restart: bool
    ) -> None:
        """Carry out one change of a reload plan (``ktd.core.reload``)."""
        engine = self.engines.get(alias)
        if kind == "remove" and engine is not None:
            engine.retired = True
            engine.request_down()
            if self._nursery is not None:
                self._nursery.start_soon(self._forget_when_stopped, engine)
            return
        assert spec is not None
        if kind == "revive" and engine is not None:
            # The same owner task serves it again, with the new spec next start.
            engine.retired = False
            engine.spec = spec
            engine.pending_spec = None
            engine.notify_changed()
        elif kind in ("add", "replace"):
            fresh = Engine(spec, self)
            self.engines[alias] = fresh
            if self._nursery is not None:
                self._nursery.start_soon(fresh.run_forever)
        elif kind == "same" and engine is not None:
            engine.pending_spec = None  # back to what runs: no restart pending any more
            engine.stale = False
        elif kind == "update" and engine is not None:
            engine.spec = spec
            engine.pending_spec = None
            engine.stale = False
        elif kind in ("restart", "stale") and engine is not None:
            engine.pending_spec = spec
            if kind == "stale":
                engine.stale = True
            if self._nursery is not None and schedule_restart:
                self._nursery.start_soon(self._restart_when_idle, engine)

    async def _forget_when_stopped(self, engine: Engine) -> None:
        await engine.wait_stopped()
        await engine.wait_until(lambda: engine.finished or not engine.retired)
        if engine.retired and self.engines.get(engine.alias) is engine:
            del self.engines[engine.alias]

    async def _restart_when_idle(self, engine: Engine) -> None:
        # An engine being adopted: let its owner take it over first (it then wants up).
        await engine.wait_until(lambda: engine.adopt is None)
        # Claim holders keep routing until their first idle moment, then give it back.
        self.claims.recall(engine, kind="idle", idle=0.0, reason="restart after reload")
        await engine.wait_until(lambda: not engine.holding())
        if engine.pending_spec is None:
            return  # a later reload went back to the running launch
        was_up = engine.want_up or engine.state == S.READY
        engine.request_down()
        downs = engine.downs
        await engine.wait_stopped()
        # Re-read: a reload during the stop may have replaced the pending spec.
        engine.spec = engine.pending_spec or engine.spec
        engine.pending_spec = None
        engine.stale = False
        if was_up and engine.downs == downs:  # an evict meanwhile wins over the restart
            engine.request_up()


class FixedPlacement:
    """The placement an adopted engine was started with (from the state file)."""

    def __init__(
        self,
        *,
        numa_nodes: tuple[int, ...],
        cpus: tuple[int, ...],
        gpus: tuple[int, ...],
        env: dict[str, str],
    ) -> None:
        self.numa_nodes = numa_nodes
        self.cpus = cpus
        self.gpus = gpus
        self.env = env

    def argv_flags(self) -> list[str]:
        return []

    def to_dict(self) -> dict[str, Any]:
        return {
            "numa_nodes": list(self.numa_nodes),
            "cpus": list(self.cpus),
            "gpus": list(self.gpus),
            "env": self.env,
            "adopted": True,
        }


def holder_view(engine: Engine) -> eviction.HolderView:
    """What the eviction policy reads of an engine."""
    return eviction.HolderView(
        alias=engine.alias,
        state=engine.state,
        want_up=engine.want_up,
        pinned=engine.spec.pinned,
        leases=engine.busy(),
        queue=tuple(engine.queue),
    )
