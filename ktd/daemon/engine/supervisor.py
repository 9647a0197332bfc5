"""The engine supervisor: one trio task per engine, the driver of its lifecycle machine.

The decisions (readiness deadline, hang kill, drain, restart loop, sleep and wake)
are ``ktd.core.lifecycle``'s: this task feeds it what it sees (the engine's
desires, its holders, its health, its exit) and carries out the one action the
machine answers: the launch (the pipeline is the injected ``Launcher``,
``ktd.daemon.engine.launcher``), the gateway and the claims' recall, SGLang's memory calls
(``ktd.daemon.engine.memory``), the stop sequence (``ktd.daemon.engine.kill``). It is the only task
that moves the engine's state.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import trio

from ktd.core import fit, loglines, sleepcost
from ktd.core import lifecycle as L
from ktd.core import states as S
from ktd.core.exits import Outcome, classify_exit
from ktd.core.states import Phase, Step
from ktd.daemon.engine import health, kill, meminfo, memory, weights
from ktd.daemon.engine.engine import Engine, Running
from ktd.daemon.engine.key import KeyDir
from ktd.daemon.engine.launcher import Launcher
from ktd.daemon.inotify import FileWatch

log = logging.getLogger("ktd.engine")

READY_LINE = "The server is fired up and ready to roll"


class Supervisor:
    def __init__(self, engine: Engine, launcher: Launcher) -> None:
        self.e = engine
        self.launcher = launcher  # the launch pipeline (``ktd.daemon.engine.launcher``)
        self.host = engine.host
        self.m = L.Lifecycle()
        self._poke = trio.Event()
        self._health = health.Watch()
        self._watchers: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._shown: tuple[Any, ...] = (self.m.state, self.m.phase, None, None)
        self._costs = sleepcost.Costs()  # its sleeps and wakes, measured: sleep or reload
        engine.on_change(self.poke)

    def poke(self) -> None:
        self._poke.set()

    def _settings(self) -> L.Settings:
        d, spec = self.host.settings, self.e.spec
        return L.Settings(
            stop_grace=d.stop_grace,
            drain_timeout=d.drain_timeout,
            hang_timeout=d.hang_timeout,
            health_timeout=spec.health_timeout,
            memory_timeout=d.memory_timeout,
            restart=spec.restart != "no",
            restart_backoff=d.restart_backoff,
            restart_max=d.restart_max,
            restart_window=d.restart_window,
            drain_engine=self.host.engine_drain,
        )

    async def _sleep_until_poked(self, timeout: float = math.inf) -> None:
        with trio.move_on_after(timeout):
            await self._poke.wait()
        self._poke = trio.Event()

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """The owner loop. Cancelled at daemon shutdown, after ``stop_all`` stopped the engine."""
        e = self.e
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if e.adopt is not None:
                    run, e.adopt = e.adopt, None
                    self._take_over(run)
                while True:
                    action = self._step()
                    if isinstance(action, L.Idle):
                        if e.retired:
                            break
                        await self._sleep_until_poked()
                        continue
                    await self._contained(action)
                    await trio.lowlevel.checkpoint()  # every turn lets the others run
                nursery.cancel_scope.cancel()
        finally:
            if e.run is not None and not self.host.keeping_engines:
                # Whatever happened (even cancellation at daemon exit), nothing may be left.
                with trio.CancelScope(shield=True):
                    await kill.kill_tree(e.run, grace=0.0, host=e.spec.host, note=e.log.note)
                KeyDir.remove(e.run.key_file)
                e.run = None
            e.finished = True
            e.notify_changed()

    def _look(self) -> L.Look:
        e, run = self.e, self.e.run
        exited = None
        if run is not None and run.exited.is_set():
            exited = self._exit_outcome(run)
        return L.Look(
            now=trio.current_time(),
            want=e.want,
            force=e.force,
            held=e.holders(),
            healthy=self._health.healthy,
            hung=self._health.hung,
            exited=exited,
            drain=e.drain_timeout,
        )

    def _step(self) -> L.Action:
        self.m.settings = self._settings()
        self.m.down_reason = self.e.down_reason
        action = self.m.step(self._look())
        self._show()
        return action

    async def _contained(self, action: L.Action) -> None:
        """A bug in one engine's supervision fails that engine, never the daemon and
        every other engine with it."""
        e = self.e
        try:
            await self._do(action)
        except Exception as exc:
            log.exception("supervisor of %s failed", e.alias)
            if e.run is not None:
                with trio.CancelScope(shield=True):
                    await kill.kill_tree(e.run, grace=0.0, host=e.spec.host, note=e.log.note)
                self._ended()
            self.m = L.Lifecycle(state=S.FAILED)
            self.m.reason = f"ktd internal error while supervising: {exc!r}"
            self.m.error_code = "load_failed"
            self.m.settle_want = L.Want.DOWN
            self._show()

    async def _do(self, action: L.Action) -> None:
        m, e = self.m, self.e
        match action:
            case L.Wait(until=until):
                await self._sleep_until_poked(until - trio.current_time())
            case L.Launch():
                failure = await self._launch()
                m.launched(failure, self._deadline(e.run) if e.run else math.inf)
            case L.Deregister():
                m.deregistered(await self.host.before_drain(e))
            case L.CheckLoad():
                reading = await memory.read_load(self.host.http, self._url(), key=self._key())
                m.load(trio.current_time(), reading)
            case L.Pause(until=until):
                self._show()
                await self._health.quiet()  # its own last /health probe has ended
                out = await memory.pause(self.host.http, self._url(), **self._admin(until))
                reload = self.host.expected_load(e.alias)  # no door: a sleep may cost more
                stop = self._costs.no_door(trio.current_time(), reload) if out.absent else None
                paused = m.paused(out.ok, absent=out.absent, at=out.at, why=out.why, instead=stop)
                await self._then(paused)
            case L.Flush(until=until):
                out = await memory.flush(self.host.http, self._url(), **self._admin(until))
                m.flushed(trio.current_time(), out.ok, absent=out.absent)
            case L.ReleaseMemory():
                self._show()  # recorded as releasing before the call (a restart adopts it so)
                await self._health.quiet()
                out = await memory.release(self.host.http, self._url(), **self._admin())
                await self._then(m.released(out.ok, out.why))
                if m.state == S.ASLEEP:
                    self._costs.asleep(trio.current_time())
                    await self._count_host_memory()
            case L.MakeRoom():
                self._show()
                why = await self.host.make_room(e)
                m.room(why is None, why, want=e.want)
            case L.Resume():
                self._show()
                self._costs.resume_asked(trio.current_time())
                out = await memory.resume(self.host.http, self._url(), **self._admin())
                await self._then(m.resumed(trio.current_time(), out.ok, out.why))
            case L.Continue():
                out = await memory.cont(self.host.http, self._url(), **self._admin())
                await self._then(m.continued(out.ok, absent=out.absent, why=out.why))
            case L.CheckHealth():
                ok = await health.is_ready(self.host.http, self._url(), e.alias, key=self._key())
                m.checked(trio.current_time(), ok)
            case L.Kill(grace=grace):
                await self._kill(grace)
        self._show()

    async def _count_host_memory(self) -> None:
        """What it holds asleep: host memory on its nodes (the estimate: status, the
        dashboard's machine picture, the fits) and its residue on its GPUs (nvidia-smi,
        where there is one: the CUDA context, buffers and graphs the saver kept)."""
        e = self.e
        e.backed_up = True
        est = await self.host.offload(weights.estimate_spec, e.spec)
        e.host_bytes = fit.host_held(est, backed_up=True)
        run = e.run
        if run is not None:
            pids = [pid for pid, _ in await self.host.offload(kill.members, run)]
            e.gpu_residue = await self.host.offload(meminfo.gpu_use, pids)
            if e.gpu_residue:
                kept = ", ".join(f"GPU {i}: {fit.gib(b)}" for i, b in sorted(e.gpu_residue.items()))
                e.log.note(f"asleep, still held on its GPUs: {kept}")
        self.host.state_changed(e)

    async def _then(self, kill_: L.Kill | None) -> None:
        if kill_ is not None:
            self._show()
            await self._kill(kill_.grace)

    def _url(self) -> str:
        assert self.e.run is not None
        return self.e.url_for(self.e.run)

    def _key(self) -> str | None:
        return None if self.e.run is None else self.e.run.api_key

    def _admin(self, until: float = math.inf) -> dict[str, Any]:
        """The bound and key of SGLang's admin-level calls (memory, pause, flush):
        ``memory_timeout``, and no later than ``until`` (a drain's budget)."""
        left = max(until - trio.current_time(), 0.1)
        run = self.e.run
        key = (run.admin_key or run.api_key) if run is not None else None
        return {"timeout": min(self.host.settings.memory_timeout, left), "key": key}

    # ------------------------------------------------------------ showing the machine

    def _show(self) -> None:
        """Mirror the machine into the engine record; publish a change; the side effects
        of arriving in a state (counters, the load history, the log)."""
        m, e = self.m, self.e
        if m.settle_want is not None:
            e.want, m.settle_want = m.settle_want, None
        if m.note is not None:
            e.log.note(m.note)
            m.note = None
        shown = (m.state, m.phase, m.reason, m.error_code)
        if shown == self._shown:
            return
        old_state = self._shown[0]
        self._shown = shown
        now = time.time()
        if m.state != e.state:
            e.since = now
        e.state, e.reason, e.error_code = m.state, m.reason, m.error_code
        if m.phase != e.phase:
            e.phase = m.phase
        if m.state != old_state:
            if m.state in (S.STOPPED, S.FAILED):
                e.stops += 1
            elif m.state == S.ASLEEP:
                e.sleeps_done += 1
            self._arrived(old_state)
        e.notify_changed()
        self.host.state_changed(e)

    def _arrived(self, old: S.State) -> None:
        m, e, st = self.m, self.e, self.e.stats
        if m.state == S.READY:
            # The idle TTL counts from now: whatever the last run's last request was,
            # a fresh load (or a restart, or a wake) has served none yet.
            e.idle_since = trio.current_time()
            e.asleep_since = e.asleep_at = None
            if old == S.STARTING and e.run is not None:
                self._became_ready(e.run)
            elif old == S.WAKING:
                self._costs.ready(trio.current_time())
                e.log.note("awake: GPU memory resumed, health checked")
        elif m.state == S.FAILED:
            st.failures += 1
            st.failed_at = trio.current_time()
            e.log.note(f"failed: {m.reason}")
            self.host.load_failed(e)
        elif m.state == S.ASLEEP:
            e.asleep_since, e.asleep_at = time.time(), trio.current_time()
            e.log.note("asleep: GPU memory released; the experts stay in host RAM")
        elif m.state == S.STARTING and m.phase is not None and m.phase.step == Step.RESTARTING:
            st.restarts += 1
        elif m.state == S.STOPPED and old != S.STOPPING and m.reason:
            e.log.note(m.reason)

    def _became_ready(self, run: Running) -> None:
        e, st = self.e, self.e.stats
        took = time.time() - run.started_at
        e.log.note(f"ready on {e.url_for(run)} (pid {run.pid}) after {took:.1f}s")
        st.loads += 1
        st.load_seconds = took
        st.load_seconds_total += took
        st.failures = 0
        if run.adopted_state is None and st.load_started is not None:
            # From the load request (probe, preflight, placement included), as the
            # operator waits for it; adopted engines' loads are not measured.
            self.host.loaded(e, time.time() - st.load_started)

    # ------------------------------------------------------------ runs

    def _take_over(self, run: Running) -> None:
        """An engine a previous daemon started (``Engine.begin_adoption`` set what it
        wants: an evict since then stands; an asleep one stays asleep)."""
        e = self.e
        e.log.start_following(from_end=True)
        e.stats.load_started = run.started_at
        e.sleeps = run.sleeps
        self.m.adopt(
            S.State(run.adopted_state) if run.adopted_state else None,
            self._deadline(run),
            sleeps=run.sleeps,
            step=run.adopted_step,
        )
        self._started(run)
        self._show()
        if self.m.state == S.ASLEEP:
            assert self._nursery is not None
            self._nursery.start_soon(self._count_host_memory)

    def _started(self, run: Running) -> None:
        """A run began (spawned or adopted): watch its exit, log and health."""
        assert self._nursery is not None
        self.e.run = run
        self.e.log.redact(run.api_key)
        self._health = health.Watch()
        scope = trio.CancelScope()
        self._watchers = scope
        self._nursery.start_soon(self._watch, run, scope)

    async def _watch(self, run: Running, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as n:
                n.start_soon(self._watch_exit, run)
                if run.proc is not None and run.proc.stdout is not None:
                    n.start_soon(self._pump_pipe, run.proc.stdout)
                else:
                    n.start_soon(self._follow_log)
                n.start_soon(self._health_loop, run)

    async def _kill(self, grace: float) -> None:
        e = self.e
        if e.run is not None:
            await kill.kill_tree(e.run, grace=grace, host=e.spec.host, note=e.log.note)
        self._ended()
        self.m.killed(trio.current_time())

    def _ended(self) -> None:
        e = self.e
        self._costs.ended()
        if self._watchers is not None:
            self._watchers.cancel()
            self._watchers = None
        e.log.stop_following()
        e.log.poll()
        if e.run is not None:
            KeyDir.remove(e.run.key_file)  # the process is gone: so goes its key
        e.run = None
        e.plan = None
        e.keep_alive = None  # a client's keep-alive lasts until the engine stops
        e.backed_up, e.gpu_residue = False, None  # a new run has no host copy yet

    # ------------------------------------------------------------ one run

    async def _launch(self) -> Outcome | None:
        """A launch by the injected ``Launcher`` (probe, preflight, place, spawn), the
        load's clock started first. None: the engine runs."""
        e = self.e
        e.stats.load_started = time.time()
        e.stats.load_percent = None
        e.stats.made_room, e.stats.owed = (), False
        run = await self.launcher.launch(e, self._follow_log)
        if isinstance(run, Outcome):
            return run
        e.sleeps = self.m.sleeps = run.sleeps
        self._started(run)
        return None

    # ------------------------------------------------------------ watching

    async def _watch_exit(self, run: Running) -> None:
        await run.wait()
        self.poke()

    async def _follow_log(self) -> None:
        """Tail the engine's file: woken by inotify on each write (no polling when idle),
        batching bursts; a slow poll remains as the fallback without inotify."""
        e = self.e
        watch = FileWatch.open(e.log.watch_path)
        try:
            while True:
                lines = e.log.poll()
                if lines and e.state == S.STARTING:
                    if any(READY_LINE in line for line in lines):
                        self._health.ready_line.set()
                    self._note_progress(lines)
                if e.state == S.STARTING:  # a bar being drawn: its percentage
                    self._note_percent(e.log.drawing())
                if watch is None:
                    await trio.sleep(0.05 if e.state == S.STARTING else 1.0)
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
        e = self.e
        shown = [ln.strip() for ln in lines if ln.strip() and not loglines.is_probe_access(ln)]
        if shown:
            e.stats.last_log = shown[-1][:300]
        for line in shown:
            text = loglines.phase_of(line)
            if text and (e.phase is None or text != e.phase.text):
                e.stats.load_percent = None  # a new step: its own bar, if any
                e.set_phase(Phase.of(Step.LOADING, text))
            self._note_percent(line)

    def _note_percent(self, line: str) -> None:
        """The load step's percentage, where the engine's progress bar gives one."""
        percent = loglines.percent_of(line)
        if percent is not None and self.e.state == S.STARTING:
            self.e.stats.load_percent = percent

    async def _pump_pipe(self, stream: trio.abc.ReceiveStream) -> None:
        """The fallback when the log file cannot be opened: ktd drains the engine's pipe."""
        e = self.e
        async with stream:
            while data := await stream.receive_some(65536):
                lines = e.log.feed(bytes(data))
                if e.state == S.STARTING and any(READY_LINE in ln for ln in lines):
                    self._health.ready_line.set()

    async def _health_loop(self, run: Running) -> None:
        d = self.host.settings
        await self._health.run(
            self.host.http,
            lambda: self.e.url_for(run),
            self.e.alias,
            state=lambda: self.e.state,
            wake=self.poke,
            health_interval=d.health_interval,
            hang_timeout=d.hang_timeout,
            key=run.api_key,
        )

    def _exit_outcome(self, run: Running) -> Outcome:
        e = self.e
        e.log.poll()
        return e.exit_outcome(classify_exit(
            run.returncode,
            was_ready=self.m.was_ready or run.adopted_state == S.READY,
            port=run.port,
            port_fixed=bool(e.spec.port),
            tail=e.log.last(80),
            log_path=str(e.log.path),
        ))  # fmt: skip

    def _deadline(self, run: Running) -> float:
        """When a starting engine must be healthy. An adopted engine that was ready gets
        ``hang_timeout`` (it hung while no ktd watched, or it answers at once); one that
        was loading keeps what is left of its ``health_timeout``."""
        now = trio.current_time()
        if run.adopted_state == S.READY:
            return now + self.host.settings.hang_timeout
        elapsed = max(0.0, time.time() - run.started_at)
        return now + max(0.0, self.e.spec.health_timeout - elapsed)
