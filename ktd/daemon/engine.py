"""The engine supervisor: one trio task per engine owns its state and its processes.

Everyone else (control handlers, the frontend's leases, TTL, reload) sets a
*desire* (``want_up``) and waits for the state to change; only ``run()`` acts.
That is why 50 concurrent loads make one launch, and why nobody ever acts on
a stale snapshot of an engine.
"""

from __future__ import annotations

import logging
import math
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import trio

from ktd.core import loglines
from ktd.core import states as S
from ktd.core.claims import ClaimRec
from ktd.core.command import LaunchError, build_env, build_launch
from ktd.core.config import DaemonSection, ModelSpec
from ktd.core.eviction import ttl_due
from ktd.core.exits import Outcome, classify_exit
from ktd.core.restart import GiveUp, RestartBudget, retry_delay
from ktd.core.sglang_options import Catalog
from ktd.daemon import health, kill, preflight, proctree, spawn
from ktd.daemon.enginelog import EngineLog
from ktd.daemon.inotify import FileWatch
from ktd.daemon.probe import KT_FORK, Prober, missing_message
from ktd.daemon.running import Running as Running  # pool.py imports it from here
from ktd.protocol import EngineInfo

log = logging.getLogger("ktd.engine")

READY_LINE = "The server is fired up and ready to roll"
_GOING_DOWN = frozenset({S.DRAINING, S.STOPPING, S.STOPPED})


class Busy(Exception):
    """The engine cannot be placed now; ``holders`` are the engines in the way."""

    def __init__(self, message: str, holders: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.holders = holders


class Unplaceable(Exception):
    """No state of the other engines would let this engine be placed (a config error)."""


class PlacementLike(Protocol):
    @property
    def numa_nodes(self) -> tuple[int, ...]: ...
    @property
    def cpus(self) -> tuple[int, ...]: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...

    def argv_flags(self) -> list[str]: ...

    def to_dict(self) -> dict[str, Any]: ...


class EngineHost(Protocol):
    """What an engine needs from the pool around it (kept narrow so engines test alone)."""

    @property
    def settings(self) -> DaemonSection: ...
    @property
    def log_dir(self) -> Path: ...
    @property
    def prober(self) -> Prober: ...
    @property
    def http(self) -> httpx.AsyncClient: ...
    @property
    def base_env(self) -> Mapping[str, str]: ...
    @property
    def instance(self) -> str: ...  # this daemon's key, prefixed to every engine id
    @property
    def keeping_engines(self) -> bool: ...  # the daemon exits and leaves engines running

    async def place(self, engine: Engine) -> PlacementLike | None: ...

    def state_changed(self, engine: Engine) -> None: ...

    async def before_drain(self, engine: Engine) -> None: ...

    def log_lines(self, engine: Engine, lines: list[str]) -> None: ...

    def loaded(self, engine: Engine, seconds: float) -> None: ...  # a launch became ready

    def expected_load(self, alias: str) -> float | None: ...  # the load ETA, if known


@dataclass
class Lease:
    id: str
    client: str
    since: float = field(default_factory=time.time)


class Engine:
    def __init__(self, spec: ModelSpec, host: EngineHost) -> None:
        self.spec = spec
        self.host = host
        self.state = S.STOPPED
        self.since = time.time()
        self.reason: str | None = None
        self.error_code: str | None = None
        self.phase: str | None = None
        self.want_up = False
        self.down_reason: str | None = None
        self.load_started: float | None = None  # wall clock: when this load began
        self.last_log: str | None = None
        self.force = False
        self.drain_timeout: float | None = None
        self.leases: dict[str, Lease] = {}
        self.claims: dict[str, ClaimRec] = {}  # frontends' standing claims (daemon/claims.py)
        self.claim_waits = 0  # of ``queue``: claims waiting (they report their requests)
        self.remote_queued = 0  # requests the frontends say wait for this engine
        self.last_used: float | None = None
        self.run: Running | None = None
        self.plan: PlacementLike | None = None
        self.restarts = 0
        self.budget = RestartBudget()  # crashes of this load, and its backoff
        self.stale = False
        self.pending_spec: ModelSpec | None = None
        self.retired = False  # removed from config: stop and forget
        self.finished = False  # the owner task has returned (a retired engine is gone)
        self.downs = 0  # request_down() calls: lets a deferred restart see an evict since
        self.adopt: Running | None = None
        self.catalog: Catalog | None = None  # the installed SGLang's options (from the probe)
        self.launch_notes: tuple[str, ...] = ()  # flags ktd left out, and why
        # Admission (pool.py): tickets of waiting acquires, in arrival order, and the
        # ticket from which new requests wait because another engine waits for this
        # one to go idle (None: not yielding).
        self.queue: list[int] = []
        self.yield_before: int | None = None
        self.failures = 0  # consecutive failed loads
        self.failed_at = 0.0  # trio clock of the last failure
        self.evictions = 0
        self.made_room: list[str] = []  # engines the pool stopped for this run's load
        self.loads = 0
        self.load_seconds: float | None = None
        self.load_seconds_total = 0.0
        self._changed = trio.Event()
        self._poke = trio.Event()
        self._health = health.Watch()
        d = host.settings
        self.log = EngineLog(
            host.log_dir / f"{spec.alias}.log",
            max_bytes=d.log_max_bytes,
            backups=d.log_backups,
            publish=lambda lines: host.log_lines(self, lines),
        )

    # ------------------------------------------------------------ queries

    @property
    def alias(self) -> str:
        return self.spec.alias

    @property
    def url(self) -> str | None:
        return None if self.run is None else self.url_for(self.run)

    def expires_at(self) -> float | None:
        """When the idle TTL would evict this engine; None without TTL or while busy."""
        return ttl_due(
            ttl=self.spec.ttl,
            state=self.state,
            leases=self.busy(),
            want_up=self.want_up,
            last_used=self.last_used,
            since=self.since,
        )

    def info(self, *, tail: int = 0) -> EngineInfo:
        run = self.run
        plan = self.plan
        loading = self.state == S.STARTING
        return EngineInfo(
            started_at=run.started_at if run else None,
            ttl=self.spec.ttl,
            expires_at=self.expires_at(),
            load_started=self.load_started if loading else None,
            load_eta=self.host.expected_load(self.alias),
            last_log=self.last_log,
            alias=self.alias,
            state=self.state,
            pid=run.pid if run else None,
            port=run.port if run else None,
            argv=list(run.argv) if run else [],
            numa_nodes=list(plan.numa_nodes) if plan else [],
            gpus=list(plan.gpus) if plan else [],
            cpus=list(plan.cpus) if plan else [],
            since=self.since,
            reason=self.reason,
            leases=self.busy(),
            claims=len(self.claims),
            made_room=list(self.made_room),
            url=self.url if self.state in (S.READY, S.DRAINING) else None,
            restarts=self.restarts,
            last_used=self.last_used,
            pinned=self.spec.pinned,
            stale=self.stale,
            log_tail=self.log.last(tail) if tail else [],
            phase=self.phase,
            sglang=self.catalog.label if self.catalog else None,
            notes=list(self.launch_notes) if run else [],
            queued=len(self.queue) - self.claim_waits + self.remote_queued,
            max_concurrent=self.spec.max_concurrent,
            max_queue=self.spec.max_queue,
            evictions=self.evictions,
            loads=self.loads,
            load_seconds=self.load_seconds,
            load_seconds_total=self.load_seconds_total,
            failures=self.failures,
            retry_in=self.retry_in() if self.state == S.FAILED else None,
        )

    def has_slot(self) -> bool:
        """Below ``max_concurrent`` (always, without one)."""
        limit = self.spec.max_concurrent
        return limit is None or self.busy() < limit

    def busy(self) -> int:
        """Requests in flight: acquire leases, and what the claims' holders report."""
        return len(self.leases) + sum(c.busy for c in self.claims.values())

    def holding(self) -> bool:
        """Someone may still send it requests: a drain waits for this to end."""
        return bool(self.leases or self.claims)

    def used(self, *, ago: float, busy: bool) -> None:
        """A claim holder's report: the idle TTL counts from its last request's end."""
        when = time.time() - (0.0 if busy else ago)
        if self.last_used is None or when > self.last_used:
            self.last_used = when

    def touch(self) -> None:
        """A holder went away: waiters on "nobody holds it" (drain, restart) look again."""
        self._wake()
        self.notify_changed()

    def retry_in(self) -> float:
        """Seconds until a request may retry this failed engine (0 = now)."""
        delay = retry_delay(self.failures, self.host.settings.restart_backoff)
        return max(0.0, self.failed_at + delay - trio.current_time())

    def set_phase(self, phase: str) -> None:
        """For the pool: a step of the load others take for it (waiting for a busy holder,
        stopping engines to make room), shown in status and events."""
        self._set_phase(phase)

    # ------------------------------------------------------------ requests (any task)

    def request_up(self) -> None:
        if self.retired:
            return
        self.want_up = True
        self.force = False
        self.down_reason = None
        self._wake()

    def request_down(
        self,
        *,
        force: bool = False,
        drain_timeout: float | None = None,
        reason: str | None = None,
    ) -> None:
        """``reason`` (e.g. "evicted to make room for X") stays on the engine's way down
        and in its stopped status, so the operator sees why it went."""
        self.want_up = False
        self.down_reason = reason or self.down_reason
        self.downs += 1
        self.force = self.force or force
        self.drain_timeout = drain_timeout
        self._wake()

    def add_lease(self, lease: Lease) -> None:
        self.leases[lease.id] = lease
        self.last_used = time.time()

    def drop_lease(self, lease_id: str) -> bool:
        if self.leases.pop(lease_id, None) is None:
            return False
        self.last_used = time.time()
        self.touch()  # waiters on "no leases" (drain, restart-when-idle)
        return True

    def notify_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    async def wait_until(self, pred: Callable[[], bool], timeout: float = math.inf) -> bool:
        with trio.move_on_after(timeout):
            while not pred():
                await self._changed.wait()
            return True
        return False

    async def wait_stopped(self) -> None:
        await self.wait_until(lambda: self.state in (S.STOPPED, S.FAILED))

    def load_settled(self) -> bool:
        """For load waiters: ready, or the attempt ended without it (failed or stopped)."""
        if self.state == S.READY:
            return True
        return not self.want_up and self.state in (S.FAILED, S.STOPPED)

    # ------------------------------------------------------------ owner task

    def _wake(self) -> None:
        self._poke.set()

    def _set(
        self,
        state: str,
        *,
        reason: str | None = None,
        phase: str | None = None,
        error_code: str | None = None,
    ) -> None:
        """The only way the state moves; ``error_code`` tells load waiters why it ended."""
        if state != self.state:
            S.check(self.state, state)
            self.since = time.time()
        if reason is None and not self.want_up and state in _GOING_DOWN:
            reason = self.down_reason
        self.state = state
        self.reason = reason
        self.phase = phase
        self.error_code = error_code
        self.notify_changed()
        self.host.state_changed(self)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.notify_changed()
        self.host.state_changed(self)

    async def _sleep_until_poked(self, timeout: float = math.inf) -> None:
        with trio.move_on_after(timeout):
            await self._poke.wait()
        self._poke = trio.Event()

    async def run_forever(self) -> None:
        """The owner loop. Cancelled at daemon shutdown, after ``shutdown()`` stopped the engine."""
        try:
            if self.adopt is not None:
                run, self.adopt = self.adopt, None
                await self._contained(self._cycle(adopted=run))
            while not self.retired:
                if self.want_up and self.state in (S.STOPPED, S.FAILED):
                    await self._contained(self._cycle())
                else:
                    await self._sleep_until_poked()
        finally:
            self.finished = True
            self.notify_changed()

    async def _contained(self, cycle: Coroutine[Any, Any, None]) -> None:
        """A bug in one engine's supervision fails that engine, never the daemon and
        every other engine with it. (``_supervise`` has already killed its processes.)"""
        try:
            await cycle
        except Exception as exc:
            log.exception("supervisor of %s failed", self.alias)
            self.want_up = False
            self.run = None
            self.plan = None
            self.state = S.STOPPED  # any state may end here: bypass the transition check
            self._fail(f"ktd internal error while supervising: {exc!r}")

    async def _cycle(self, adopted: Running | None = None) -> None:
        """Start, supervise and restart (per policy) until stopped or failed."""
        port_retries = 1
        first = True
        # A new cycle is an explicit load: crashes of an earlier (failed) attempt do not
        # count against its restart budget.
        self.budget.reset()
        while self.want_up or (adopted is not None and first):
            if adopted is not None and first:
                outcome = await self._adopted(adopted)
            else:
                outcome = await self._run_once(restart=not first)
            first = False
            if outcome.kind == "port_taken" and port_retries > 0 and self.want_up:
                port_retries -= 1
                self.log.note(f"{outcome.reason}; retrying once on another port")
                continue
            if outcome.kind == "crashed" and self.want_up and self.spec.restart != "no":
                d = self.host.settings
                step = self.budget.on_crash(
                    time.monotonic(),
                    outcome.reason or "crashed",
                    window=d.restart_window,
                    max_crashes=d.restart_max,
                    backoff=d.restart_backoff,
                )
                if isinstance(step, GiveUp):
                    self._fail(step.reason)
                    return
                delay = step.delay
                self.restarts += 1
                self._set(S.STARTING, reason=outcome.reason, phase=f"restart in {delay:.1f}s")
                self.log.note(f"{outcome.reason}; restarting in {delay:.1f}s")
                await self._sleep_until_poked(delay)
                while self._poke.is_set():
                    self._poke = trio.Event()
                if not self.want_up:
                    self._set(S.STOPPED, reason="stopped during restart backoff")
                    return
                continue
            # "stopped" was asked for: leave want_up alone (a load may have come since).
            if outcome.kind in ("crashed", "failed", "port_taken"):
                self._fail(outcome.reason or outcome.kind)
            elif outcome.kind == "exited":
                self.want_up = False
                self.log.note(outcome.reason or "exited")
                self._set(S.STOPPED, reason=outcome.reason)
            elif outcome.kind == "busy":
                self.want_up = False
                self._set(S.STOPPED, reason=outcome.reason, error_code="busy")
            return

    def _fail(self, reason: str) -> None:
        self.want_up = False
        self.failures += 1
        self.failed_at = trio.current_time()
        self.log.note(f"failed: {reason}")
        self._set(S.FAILED, reason=reason, error_code="load_failed")

    # ------------------------------------------------------------ one run

    async def _run_once(self, *, restart: bool) -> Outcome:
        self.load_started = time.time()
        self.made_room = []
        self._set(
            S.STARTING, reason=self.reason if restart else None, phase="probing engine Python"
        )
        env = build_env(self.spec, self.host.base_env)
        probe = await self.host.prober.probe(self.spec.python, env)
        if self.spec.auto_build and probe.ok_python and probe.sglang is None:
            problem = missing_message(probe, auto_build=True)
            if problem:
                return Outcome("failed", problem)
            built = await self._pip_install_sglang(env, probe.kt_kernel)
            if not built:
                return Outcome("failed", f"`pip install {KT_FORK}` failed; see the log")
            self.host.prober.forget()
            probe = await self.host.prober.probe(self.spec.python, env)
        problem = missing_message(probe, auto_build=False)
        if problem:
            return Outcome("failed", problem)
        self.catalog = probe.catalog
        if not self.want_up:
            self._set(S.STOPPED, reason="stopped before launch")
            return Outcome("stopped")

        # Before placing: placing may evict ready engines, and a load that cannot
        # start must never cost a running model. Among the checks: a flag the
        # installed SGLang would refuse (its catalogue, from the probe).
        self._set_phase("preflight")
        refusal = await preflight.run(self.spec, probe)
        if refusal:
            return Outcome("failed", refusal)
        self._set_phase("placing")
        try:
            self.plan = await self.host.place(self)
        except Busy as exc:
            self.plan = None
            return Outcome("busy", str(exc))
        except Unplaceable as exc:
            self.plan = None
            return Outcome("failed", f"cannot be placed on this machine: {exc}")
        except preflight.Refused as exc:
            self.plan = None
            return Outcome("failed", str(exc))
        if not self.want_up:
            self.plan = None
            self._set(S.STOPPED, reason="stopped before launch")
            return Outcome("stopped")
        port = self.spec.port or proctree.pick_port(self.spec.host)
        flags = self.plan.argv_flags() if self.plan else []
        try:
            launch = build_launch(self.spec, port, flags, self.catalog)
        except LaunchError as exc:
            self.plan = None
            return Outcome("failed", str(exc))
        argv = launch.argv
        self.launch_notes = launch.notes
        engine_id = f"{self.host.instance}/{self.alias}@{time.time_ns()}"
        env = build_env(
            self.spec,
            self.host.base_env,
            self.plan.env if self.plan else None,
            engine_id=engine_id,
            digest=self.spec.launch_digest(),
        )
        try:
            run = await self._spawn(argv, env, port, engine_id)
        except OSError as exc:
            self.plan = None
            return Outcome("failed", f"cannot start {argv[0]}: {exc.strerror or exc}")
        self.run = run
        self._set_phase("loading")
        return await self._supervise(run)

    async def _adopted(self, run: Running) -> Outcome:
        """Supervise an engine a previous daemon started. One that daemon was stopping
        is stopped: a ``kill -9`` of ktd must not undo an evict."""
        self.run = run
        self.want_up = run.adopted_state not in (S.DRAINING, S.STOPPING)
        self.log.start_following(from_end=True)
        self.load_started = run.started_at
        self._set(S.STARTING, phase="adopting")
        return await self._supervise(run)

    async def _spawn(self, argv: list[str], env: dict[str, str], port: int, eid: str) -> Running:
        plan = self.plan
        cmd, env = spawn.pinned(
            argv,
            env,
            cpus=plan.cpus if plan else (),
            mems=plan.numa_nodes if plan else (),
        )
        proc = await spawn.open_logged(
            self.log,
            cmd,
            env,
            note=f"starting: {subprocess.list2cmdline(argv)}",
            no_log=subprocess.PIPE,
        )
        info = proctree.read_stat(proc.pid)
        run = Running(
            digest=self.spec.launch_digest(),
            pid=proc.pid,
            start=info.start if info else 0,
            engine_id=eid,
            port=port,
            argv=argv,
            proc=proc,
        )
        self.host.state_changed(self)
        return run

    async def _pip_install_sglang(self, env: dict[str, str], kt_kernel: str | None) -> bool:
        """``auto_build`` (see ``spawn.pip_install_argv``), the log followed meanwhile."""
        self._set_phase(f"pip install {KT_FORK}")
        cmd = spawn.pip_install_argv(self.spec.python, kt_kernel)
        proc = await spawn.open_logged(
            self.log,
            cmd,
            env,
            note=f"auto_build: {subprocess.list2cmdline(cmd)}",
            no_log=subprocess.DEVNULL,
        )
        try:
            async with trio.open_nursery() as n:
                n.start_soon(self._follow_log)
                code = await proc.wait()
                n.cancel_scope.cancel()
        finally:
            if proc.returncode is None:
                proctree.signal_group(proc.pid, signal.SIGKILL)
                with trio.CancelScope(shield=True):
                    await proc.wait()
        self.log.poll()
        return code == 0

    # ------------------------------------------------------------ supervision

    def _deadline(self, run: Running) -> float:
        """When a starting engine must be healthy. An adopted engine that was ready gets
        ``hang_timeout`` (it hung while no ktd watched, or it answers at once); one that
        was loading keeps what is left of its ``health_timeout``."""
        now = trio.current_time()
        if run.adopted_state == S.READY:
            return now + self.host.settings.hang_timeout
        elapsed = max(0.0, time.time() - run.started_at)
        return now + max(0.0, self.spec.health_timeout - elapsed)

    async def _supervise(self, run: Running) -> Outcome:
        self._health = health.Watch()
        deadline = self._deadline(run)
        try:
            async with trio.open_nursery() as n:
                n.start_soon(self._watch_exit, run)
                if run.proc is not None and run.proc.stdout is not None:
                    n.start_soon(self._pump_pipe, run.proc.stdout)
                else:
                    n.start_soon(self._follow_log)
                n.start_soon(self._health_loop, run)
                outcome = await self._decide(run, deadline)
                n.cancel_scope.cancel()
        finally:
            # Whatever happened (even cancellation at daemon exit), nothing may be left.
            if self.run is run and not self._keep_on_exit():
                with trio.CancelScope(shield=True):
                    await self._kill_everything(run, grace=0.0)
        self.log.poll()
        return outcome

    def _keep_on_exit(self) -> bool:
        return self.host.keeping_engines

    async def _watch_exit(self, run: Running) -> None:
        await run.wait()
        self._wake()

    async def _follow_log(self) -> None:
        """Tail the engine's file: woken by inotify on each write (no polling when idle),
        batching bursts; a slow poll remains as the fallback without inotify."""
        watch = FileWatch.open(self.log.watch_path)
        try:
            while True:
                lines = self.log.poll()
                if lines and self.state == S.STARTING:
                    if any(READY_LINE in line for line in lines):
                        self._health.ready_line.set()
                    self._note_progress(lines)
                if watch is None:
                    await trio.sleep(0.05 if self.state == S.STARTING else 1.0)
                    continue
                with trio.move_on_after(30):  # rotation re-creates nothing, but be safe
                    await watch.wait()
                await trio.sleep(0.01)  # a burst of lines becomes one read
        finally:
            if watch is not None:
                watch.close()

    def _note_progress(self, lines: list[str]) -> None:
        """The last log line and the load phase its milestones announce (kept apart:
        status shows a phase, never a raw log line)."""
        shown = [ln.strip() for ln in lines if ln.strip() and not loglines.is_probe_access(ln)]
        if shown:
            self.last_log = shown[-1][:300]
        for line in shown:
            phase = loglines.phase_of(line)
            if phase and phase != self.phase:
                self._set_phase(phase)

    async def _pump_pipe(self, stream: trio.abc.ReceiveStream) -> None:
        """The fallback when the log file cannot be opened: ktd drains the engine's pipe."""
        async with stream:
            while data := await stream.receive_some(65536):
                lines = self.log.feed(bytes(data))
                if self.state == S.STARTING and any(READY_LINE in ln for ln in lines):
                    self._health.ready_line.set()

    async def _health_loop(self, run: Running) -> None:
        d = self.host.settings
        await self._health.run(
            self.host.http,
            lambda: self.url_for(run),
            self.alias,
            state=lambda: self.state,
            wake=self._wake,
            health_interval=d.health_interval,
            hang_timeout=d.hang_timeout,
        )

    def url_for(self, run: Running) -> str:
        """Where to reach the engine: a wildcard bind is reached on loopback."""
        return health.engine_url(self.spec.host, run.port)

    async def _decide(self, run: Running, deadline: float) -> Outcome:
        while True:
            if run.exited.is_set():
                return self._exit_outcome(run)
            if not self.want_up:
                await self._stop(run)
                return Outcome("stopped")
            if self.state == S.STARTING and self._health.healthy:
                took = time.time() - run.started_at
                self.log.note(f"ready on {self.url_for(run)} (pid {run.pid}) after {took:.1f}s")
                self.loads += 1
                self.load_seconds = took
                self.load_seconds_total += took
                self.failures = 0
                if run.adopted_state is None and self.load_started is not None:
                    # From the load request (probe, preflight, placement included), as the
                    # operator waits for it; adopted engines' loads are not measured.
                    self.host.loaded(self, time.time() - self.load_started)
                self._set(S.READY)
                self.last_used = self.last_used or time.time()
            if self.state == S.STARTING and trio.current_time() >= deadline:
                if run.adopted_state == S.READY:
                    reason = (
                        "hung: the adopted engine did not answer /health within "
                        f"{self.host.settings.hang_timeout:g}s"
                    )
                    self.log.note(f"{reason}; killing the engine")
                    await self._kill_everything(run, grace=0.0)
                    return Outcome("crashed", reason)
                reason = (
                    f"not healthy within {self.spec.health_timeout:g}s (health_timeout); killed"
                )
                await self._kill_everything(run, grace=self.host.settings.stop_grace)
                return Outcome("failed", reason)
            if self.state == S.READY and self._health.hung:
                reason = (
                    f"hung: /health did not answer 200 for {self.host.settings.hang_timeout:g}s"
                )
                self.log.note(f"{reason}; killing the engine")
                await self._kill_everything(run, grace=0.0)
                return Outcome("crashed", reason)
            wait = deadline - trio.current_time() if self.state == S.STARTING else math.inf
            await self._sleep_until_poked(max(wait, 0.0))

    def _exit_outcome(self, run: Running) -> Outcome:
        self.log.poll()
        outcome = classify_exit(
            run.returncode,
            was_ready=self.state == S.READY or run.adopted_state == S.READY,
            port=run.port,
            port_fixed=bool(self.spec.port),
            tail=self.log.last(80),
            log_path=str(self.log.path),
        )
        if outcome.kind == "exited":  # a clean exit nobody asked for: not a crash
            self.want_up = False
        return outcome

    async def _stop(self, run: Running) -> None:
        """Drain (bounded) → SIGTERM the group → grace → SIGKILL everything that is left."""
        if self.state == S.READY:
            # Off the gateway first (sglang-router): nothing new arrives while it drains.
            await self.host.before_drain(self)
        if self.state == S.READY and self.holding() and not self.force:
            timeout = self.drain_timeout
            if timeout is None:
                timeout = self.host.settings.drain_timeout
            self._set(S.DRAINING, phase=f"waiting for {self.busy()} request(s)")
            with trio.move_on_after(timeout):
                while self.holding() and not self.force and not run.exited.is_set():
                    await self._sleep_until_poked()
            if self.holding():
                self.log.note(f"drain ended with {self.busy()} request(s) still running")
        self._set(S.STOPPING, phase="terminating")
        await self._kill_everything(run, grace=0.0 if self.force else self.host.settings.stop_grace)

    async def _kill_everything(self, run: Running, *, grace: float) -> None:
        await kill.kill_tree(run, grace=grace, host=self.spec.host, note=self.log.note)
        self.log.stop_following()
        self.run = None
        self.plan = None
        if self.state in (S.STOPPING,):
            self._set(S.STOPPED)
        else:
            self.host.state_changed(self)
