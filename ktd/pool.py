"""The engine pool: routing, placement, leases, TTL, and the operations of the control API.

The pool never touches an engine's processes: it sets desires on engines and
waits for their supervisors. Operations raise ``OpError`` with a stable code.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from ktd import fit, loglines, proctree, statefile, weights
from ktd import states as S
from ktd.command import ENGINE_MARK, build_env, planner_args
from ktd.config import Config, ModelSpec
from ktd.engine import Busy, Engine, Lease, PlacementLike, Running
from ktd.loadhistory import LoadHistory
from ktd.preflight import Refused
from ktd.probe import Prober, ProbeResult
from ktd.protocol import EngineInfo, ErrorCode, Event, ModelInfo
from ktd.sglang_options import Catalog


class OpError(Exception):
    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}


Publisher = Callable[[str, Event], None]

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
        self.prober = Prober()
        self.http: httpx.AsyncClient = httpx.AsyncClient(trust_env=False)
        self.base_env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        self.engines: dict[str, Engine] = {}
        self.leases: dict[str, Engine] = {}
        self.clients: dict[str, float] = {}
        self.keeping_engines = False
        self.shutting_down = False
        self._place_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._topology: Any = None
        self._ttl_wake = trio.Event()
        self._restart_after_adoption: list[Engine] = []
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
    def topology(self) -> Any:
        if self._topology is None:
            from ktd.topology import read_topology

            self._topology = read_topology(
                weights.machine_root(), nvidia_smi=weights.nvidia_smi_cmd()
            )
        return self._topology

    def refresh_topology(self, topo: Any) -> None:
        self._topology = topo

    def holdings(self, exclude: Engine | None = None) -> list[Any]:
        from ktd.placement import Holding

        out = []
        for e in self.engines.values():
            if e is exclude or e.plan is None or e.state not in S.HOLDS_RESOURCES:
                continue
            out.append(
                Holding(
                    alias=e.alias,
                    numa_nodes=tuple(e.plan.numa_nodes),
                    gpus=tuple(e.plan.gpus),
                    leases=len(e.leases),
                    pinned=e.spec.pinned,
                    last_used=e.last_used or e.since,
                    state=e.state,
                )
            )
        return out

    def make_plan(
        self, spec: ModelSpec, *, exclude: Engine | None = None, catalog: Catalog | None = None
    ) -> Any:
        """The placement of ``spec`` given every other engine's holdings (pure given those).

        With ``catalog`` the user's flags are read as SGLang reads them (prefixes
        included); raises :class:`~ktd.command.LaunchError` for ones it would refuse.
        """
        from ktd.placement import plan

        return plan(
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

    async def fit(self, spec: ModelSpec, plan: Any) -> tuple[fit.Estimate, fit.Fit]:
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
        async with self._place_lock:
            for attempt in range(len(self.engines) + 1):
                plan = self.make_plan(engine.spec, exclude=engine, catalog=engine.catalog)
                if plan.ok and attempt == 0 and engine.spec.fit != "ignore":
                    # Once, before anything is evicted: after an eviction the victim's
                    # memory may take a while to show up as free.
                    _, verdict = await self.fit(engine.spec, plan)
                    if not verdict.ok:
                        raise Refused(f"{verdict.reason}; no engine was stopped")
                if not plan.ok:
                    leaving = [
                        self.engines[a]
                        for a in plan.blocked_by
                        if a in self.engines and not self.engines[a].want_up
                    ]
                    if leaving:  # already being evicted: wait for them rather than fail
                        for victim in leaving:
                            await victim.wait_stopped()
                        continue
                    raise Busy(plan.reason or "cannot be placed", tuple(plan.blocked_by))
                if not plan.evict:
                    result: PlacementLike = plan
                    return result
                engine.set_phase(f"stopping {', '.join(plan.evict)} to make room")
                for alias in plan.evict:
                    victim = self.engines[alias]
                    why = f"evicted to make room for {engine.alias}"
                    victim.log.note(why)
                    victim.request_down(reason=why)
                for alias in plan.evict:
                    await self.engines[alias].wait_stopped()
            raise Busy("cannot be placed: evictions did not free enough", ())

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
        self._ttl_wake.set()
        # Written at once, not batched: a kill -9 right after this change must find it.
        self.save_state()

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
            Event(topic=topic, time=time.time(), alias=engine.alias, leases=len(engine.leases)),
        )
        self._ttl_wake.set()

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
                )
            )
        return statefile.StateFile(daemon_pid=os.getpid(), engines=records)

    def save_state(self) -> None:
        if self.state_path is None:
            return
        try:
            statefile.write(self.state_path, self.snapshot())
        except OSError as exc:
            self.publish(
                "daemon",
                Event(
                    topic="daemon",
                    time=time.time(),
                    alias="",
                    reason=f"cannot write state file: {exc}",
                ),
            )

    def adopt(self) -> tuple[list[str], list[int]]:
        """Take over the engines a previous daemon left running; kill what cannot be adopted.

        Call before ``run()``. Returns (adopted aliases, killed pids).
        """
        adopted: list[str] = []
        keep: set[str] = set()
        if self.state_path is not None:
            for rec in statefile.read(self.state_path).engines:
                engine = self.engines.get(rec.alias)
                if engine is None or engine.adopt is not None or not statefile.same_process(rec):
                    continue
                try:
                    pidfd: int | None = os.pidfd_open(rec.pid)
                except OSError:
                    pidfd = None
                engine.adopt = Running(
                    digest=rec.digest,
                    adopted_state=rec.state,
                    started_at=rec.started_at or rec.since,
                    pid=rec.pid,
                    start=rec.start,
                    engine_id=rec.engine_id,
                    port=rec.port,
                    argv=rec.argv,
                    pidfd=pidfd,
                )
                engine.plan = FixedPlacement(  # type: ignore[assignment]
                    numa_nodes=tuple(rec.numa_nodes),
                    cpus=tuple(rec.cpus),
                    gpus=tuple(rec.gpus),
                    env=dict(rec.env),
                )
                keep.add(rec.engine_id)
                adopted.append(rec.alias)
                if rec.digest != engine.spec.launch_digest():
                    # The config changed while no ktd watched: restart it when idle,
                    # as a reload would have.
                    engine.pending_spec = engine.spec
                    engine.stale = True
                    self._restart_after_adoption.append(engine)
        killed = kill_strays(f"{self.instance}/", keep)
        return adopted, killed

    # ------------------------------------------------------------ lookups

    def engine(self, alias: str) -> Engine:
        engine = self.engines.get(alias)
        if engine is not None:
            return engine
        spec = self.config.models.get(alias)
        if spec is not None and not spec.served:
            raise OpError(
                ErrorCode.NOT_KT,
                f"{alias!r} is configured but not served by ktd: {spec.not_served_reason}",
                {"backend": spec.backend},
            )
        raise OpError(
            ErrorCode.UNKNOWN_MODEL,
            f"unknown model {alias!r}; ktd serves: {', '.join(sorted(self.engines)) or 'nothing'}",
            {"models": sorted(self.engines)},
        )

    def status(self, alias: str | None = None) -> list[EngineInfo]:
        if alias is not None:
            return [self.engine(alias).info(tail=20)]
        return [e.info(tail=20 if e.state == S.FAILED else 0) for e in self.engines.values()]

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
            raise OpError(ErrorCode.SHUTTING_DOWN, "ktd is shutting down")

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
            raise OpError(
                ErrorCode.TIMEOUT,
                f"{alias} not ready after {limit:g}s (still {engine.state}; the load goes on)",
                {"state": engine.state},
            )
        return self._settled(engine)

    def _settled(self, engine: Engine) -> EngineInfo:
        if engine.state == S.READY:
            return engine.info()
        info = engine.info(tail=40)
        detail = {"reason": engine.reason, "log_tail": info.log_tail, "state": engine.state}
        if engine.error_code == ErrorCode.BUSY:
            raise OpError(ErrorCode.BUSY, f"{engine.alias}: {engine.reason}", detail)
        raise OpError(ErrorCode.LOAD_FAILED, f"{engine.alias}: {engine.reason}", detail)

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
            raise OpError(ErrorCode.BAD_REQUEST, "evict needs an alias or all=true")
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
        self, model: str, client: str, *, autoload: bool = True, timeout: float | None = None
    ) -> tuple[str, Engine]:
        engine = self.engine(model)
        self._check_open()
        self.heartbeat(client)
        if engine.state != S.READY:
            if not autoload:
                raise OpError(
                    ErrorCode.NOT_LOADED,
                    f"{model} is not loaded (state {engine.state}); run: ktctl load {model}",
                    {"state": engine.state},
                )
            if engine.state == S.FAILED and not engine.want_up:
                raise OpError(
                    ErrorCode.LOAD_FAILED,
                    f"{model} failed: {engine.reason}; run `ktctl load {model}` to retry",
                    {"reason": engine.reason, "log_tail": engine.log.last(20)},
                )
            await self.load(model, wait=True, timeout=timeout)
        return self.grant(engine, client), engine

    def ready_engine(self, model: str) -> Engine | None:
        """The engine for ``model`` if a lease can be granted at once (the hot path)."""
        engine = self.engines.get(model)
        if engine is None or engine.state != S.READY or self.shutting_down:
            return None
        return engine

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
        """Leases of a frontend that stopped sending heartbeats expire (it died mid-request)."""
        ttl = max(self.settings.lease_ttl, 0.5)
        while True:
            await trio.sleep(ttl / 3)
            now = trio.current_time()
            dead = {c for c, seen in self.clients.items() if now - seen > ttl}
            if not dead:
                continue
            for lease_id, engine in list(self.leases.items()):
                lease = engine.leases.get(lease_id)
                if lease is not None and lease.client in dead:
                    self.release(lease_id)
            for c in dead:
                del self.clients[c]

    async def _ttl_sweeper(self) -> None:
        """Idle TTL: counted from the end of the last request, never while a lease is held."""
        while True:
            now = time.time()
            next_due = math.inf
            for e in self.engines.values():
                ttl = e.spec.ttl
                if ttl <= 0 or e.state != S.READY or e.leases or not e.want_up:
                    continue
                due = (e.last_used or e.since) + ttl
                if due <= now:
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
        added: list[str] = []
        removed: list[str] = []
        restarted: list[str] = []
        stale: list[str] = []
        updated: list[str] = []
        new_served = {s.alias: s for s in new.served()}
        for alias, engine in list(self.engines.items()):
            if alias not in new_served:
                engine.retired = True
                engine.request_down()
                removed.append(alias)
                if self._nursery is not None:
                    self._nursery.start_soon(self._forget_when_stopped, engine)
        for alias, spec in new_served.items():
            existing = self.engines.get(alias)
            if existing is not None and existing.retired:
                if not existing.finished:
                    # Removed by an earlier reload, back before its engine stopped:
                    # the same owner task serves it again, with the new spec next start.
                    existing.retired = False
                    existing.spec = spec
                    existing.pending_spec = None
                    existing.notify_changed()
                    added.append(alias)
                    continue
                del self.engines[alias]
                existing = None
            if existing is None:
                fresh = Engine(spec, self)
                self.engines[alias] = fresh
                if self._nursery is not None:
                    self._nursery.start_soon(fresh.run_forever)
                added.append(alias)
                continue
            engine = existing
            if spec == engine.spec:
                engine.pending_spec = None  # back to what runs: no restart pending any more
                engine.stale = False
                continue
            if (
                spec.launch_key() == engine.spec.launch_key()
                or engine.state not in S.HOLDS_RESOURCES
            ):
                engine.spec = spec
                engine.pending_spec = None
                engine.stale = False
                updated.append(alias)
                continue
            restart_pending = engine.pending_spec is not None
            engine.pending_spec = spec
            if engine.leases:
                engine.stale = True
                stale.append(alias)
            else:
                restarted.append(alias)
            if self._nursery is not None and not restart_pending:
                self._nursery.start_soon(self._restart_when_idle, engine)
        self.config = new
        self.settings = new.daemon
        parts = [
            f"{name}: {', '.join(items)}"
            for name, items in (
                ("added", added),
                ("removed", removed),
                ("restarting", restarted),
                ("stale until idle", stale),
                ("updated in place", updated),
            )
            if items
        ]
        return "; ".join(parts) or "no changes"

    async def _forget_when_stopped(self, engine: Engine) -> None:
        await engine.wait_stopped()
        await engine.wait_until(lambda: engine.finished or not engine.retired)
        if engine.retired and self.engines.get(engine.alias) is engine:
            del self.engines[engine.alias]

    async def _restart_when_idle(self, engine: Engine) -> None:
        # An engine being adopted: let its owner take it over first (it then wants up).
        await engine.wait_until(lambda: engine.adopt is None)
        await engine.wait_until(lambda: not engine.leases)
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


def kill_strays(prefix: str, keep: set[str]) -> list[int]:
    """SIGKILL every process marked as an engine of this daemon instance that is not kept."""
    killed = []
    me = os.getpid()
    for pid in proctree.all_procs():
        if pid == me:
            continue
        value = proctree.environ_get(pid, ENGINE_MARK)
        if value is not None and value.startswith(prefix) and value not in keep:
            try:
                os.kill(pid, 9)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed
