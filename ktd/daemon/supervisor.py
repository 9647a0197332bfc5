"""The engine supervisor: one trio task per engine, the only one that moves its state.

It reads the engine's desires (``want_up``) and its processes' facts (exit, health,
log milestones) and acts: launch, watch, restart per policy, drain and stop. Its
decisions over time are the pure policies of ``ktd.core`` (states, restart budget,
exit classification; the stop sequence in ``ktd.daemon.kill``); this module is the
loop that feeds them and carries them out.
"""

from __future__ import annotations

import logging
import math
import signal
import subprocess
import time
from collections.abc import Coroutine
from typing import Any

import trio

from ktd.core import loglines
from ktd.core import states as S
from ktd.core.command import LaunchError, build_env, build_launch
from ktd.core.exits import Outcome, classify_exit
from ktd.core.restart import GiveUp
from ktd.core.states import Phase, State, Step
from ktd.daemon import health, kill, preflight, proctree, spawn
from ktd.daemon.engine import Busy, Engine, Running, Unplaceable
from ktd.daemon.inotify import FileWatch
from ktd.daemon.probe import KT_FORK, missing_message

log = logging.getLogger("ktd.engine")

READY_LINE = "The server is fired up and ready to roll"


class Supervisor:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.host = engine.host
        self._poke = trio.Event()
        self._health = health.Watch()
        engine.supervisor = self

    def poke(self) -> None:
        self._poke.set()

    # ------------------------------------------------------------ state moves

    def _set(
        self,
        state: State,
        *,
        reason: str | None = None,
        phase: Phase | None = None,
        error_code: str | None = None,
    ) -> None:
        """The only way the state moves; ``error_code`` tells load waiters why it ended."""
        e = self.e
        old = e.state
        if state != old:
            S.check(old, state)
            e.since = time.time()
        if reason is None and not e.want_up and state in S.GOING_DOWN:
            reason = e.down_reason
        e.state = state
        e.reason = reason
        e.phase = phase
        e.error_code = error_code
        if state == S.READY and state != old:
            # The idle TTL counts from now: whatever the last run's last request was,
            # a fresh load (or a restart) has served none yet.
            e.idle_since = trio.current_time()
        e.notify_changed()
        self.host.state_changed(e)

    def _fail(self, reason: str) -> None:
        e = self.e
        e.want_up = False
        e.stats.failures += 1
        e.stats.failed_at = trio.current_time()
        e.log.note(f"failed: {reason}")
        self._set(S.FAILED, reason=reason, error_code="load_failed")
        self.host.load_failed(e)

    async def _sleep_until_poked(self, timeout: float = math.inf) -> None:
        with trio.move_on_after(timeout):
            await self._poke.wait()
        self._poke = trio.Event()

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """The owner loop. Cancelled at daemon shutdown, after ``stop_all`` stopped the engine."""
        e = self.e
        try:
            if e.adopt is not None:
                run, e.adopt = e.adopt, None
                await self._contained(self._cycle(adopted=run))
            while not e.retired:
                if e.want_up and e.state in (S.STOPPED, S.FAILED):
                    await self._contained(self._cycle())
                else:
                    await self._sleep_until_poked()
        finally:
            e.finished = True
            e.notify_changed()

    async def _contained(self, cycle: Coroutine[Any, Any, None]) -> None:
        """A bug in one engine's supervision fails that engine, never the daemon and
        every other engine with it. (``_supervise`` has already killed its processes.)"""
        e = self.e
        try:
            await cycle
        except Exception as exc:
            log.exception("supervisor of %s failed", e.alias)
            e.want_up = False
            e.run = None
            e.plan = None
            e.state = S.STOPPED  # any state may end here: bypass the transition check
            self._fail(f"ktd internal error while supervising: {exc!r}")

    async def _cycle(self, adopted: Running | None = None) -> None:
        """Start, supervise and restart (per policy) until stopped or failed."""
        e = self.e
        port_retries = 1
        first = True
        # A new cycle is an explicit load: crashes of an earlier (failed) attempt do not
        # count against its restart budget.
        e.budget.reset()
        while e.want_up or (adopted is not None and first):
            if adopted is not None and first:
                outcome = await self._adopted(adopted)
            else:
                outcome = await self._run_once(restart=not first)
            first = False
            if outcome.kind == "port_taken" and port_retries > 0 and e.want_up:
                port_retries -= 1
                e.log.note(f"{outcome.reason}; retrying once on another port")
                continue
            if outcome.kind == "crashed" and e.want_up and e.spec.restart != "no":
                if not await self._restart_after_crash(outcome.reason or "crashed"):
                    return
                continue
            # "stopped" was asked for: leave want_up alone (a load may have come since).
            if outcome.kind in ("crashed", "failed", "port_taken"):
                self._fail(outcome.reason or outcome.kind)
            elif outcome.kind == "exited":
                e.want_up = False
                e.log.note(outcome.reason or "exited")
                self._set(S.STOPPED, reason=outcome.reason)
            elif outcome.kind == "busy":
                e.want_up = False
                self._set(S.STOPPED, reason=outcome.reason, error_code="busy")
            return

    async def _restart_after_crash(self, reason: str) -> bool:
        """The restart policy's step after a crash; False when the cycle ends here."""
        e = self.e
        d = self.host.settings
        step = e.budget.on_crash(
            time.monotonic(),
            reason,
            window=d.restart_window,
            max_crashes=d.restart_max,
            backoff=d.restart_backoff,
        )
        if isinstance(step, GiveUp):
            self._fail(step.reason)
            return False
        e.stats.restarts += 1
        text = f"restart in {step.delay:.1f}s"
        self._set(S.STARTING, reason=reason, phase=Phase.of(Step.RESTARTING, text))
        e.log.note(f"{reason}; restarting in {step.delay:.1f}s")
        await self._sleep_until_poked(step.delay)
        while self._poke.is_set():  # woken early (a request_down?): look, then wait the rest
            self._poke = trio.Event()
        if not e.want_up:
            self._set(S.STOPPED, reason="stopped during restart backoff")
            return False
        return True

    # ------------------------------------------------------------ one run

    async def _run_once(self, *, restart: bool) -> Outcome:
        e = self.e
        e.stats.load_started = time.time()
        e.stats.made_room, e.stats.owed = (), False
        self._set(S.STARTING, reason=e.reason if restart else None, phase=Phase.of(Step.PROBING))
        env = build_env(e.spec, self.host.base_env)
        probe = await self.host.prober.probe(e.spec.python, env)
        if e.spec.auto_build and probe.ok_python and probe.sglang is None:
            problem = missing_message(probe, auto_build=True)
            if problem:
                return Outcome("failed", problem)
            built = await self._pip_install_sglang(env, probe.kt_kernel)
            if not built:
                return Outcome("failed", f"`pip install {KT_FORK}` failed; see the log")
            self.host.prober.forget()
            probe = await self.host.prober.probe(e.spec.python, env)
        problem = missing_message(probe, auto_build=False)
        if problem:
            return Outcome("failed", problem)
        e.catalog = probe.catalog
        if not e.want_up:
            self._set(S.STOPPED, reason="stopped before launch")
            return Outcome("stopped")

        # Before placing: placing may evict ready engines, and a load that cannot
        # start must never cost a running model. Among the checks: a flag the
        # installed SGLang would refuse (its catalogue, from the probe).
        e.set_phase(Phase.of(Step.PREFLIGHT))
        refusal = await preflight.run(e.spec, probe)
        if refusal:
            return Outcome("failed", refusal)
        e.set_phase(Phase.of(Step.PLACING))
        try:
            e.plan = await self.host.place(e)
        except Busy as exc:
            e.plan = None
            return Outcome("busy", str(exc))
        except Unplaceable as exc:
            e.plan = None
            return Outcome("failed", f"cannot be placed on this machine: {exc}")
        except preflight.Refused as exc:
            e.plan = None
            return Outcome("failed", str(exc))
        if not e.want_up:
            e.plan = None
            self._set(S.STOPPED, reason="stopped before launch")
            return Outcome("stopped")
        port = e.spec.port or proctree.pick_port(e.spec.host)
        flags = e.plan.argv_flags() if e.plan else []
        try:
            launch = build_launch(e.spec, port, flags, e.catalog)
        except LaunchError as exc:
            e.plan = None
            return Outcome("failed", str(exc))
        argv = launch.argv
        e.launch_notes = launch.notes
        engine_id = f"{self.host.instance}/{e.alias}@{time.time_ns()}"
        env = build_env(
            e.spec,
            self.host.base_env,
            e.plan.env if e.plan else None,
            engine_id=engine_id,
            digest=e.spec.launch_digest(),
        )
        try:
            run = await self._spawn(argv, env, port, engine_id)
        except OSError as exc:
            e.plan = None
            return Outcome("failed", f"cannot start {argv[0]}: {exc.strerror or exc}")
        e.run = run
        e.set_phase(Phase.of(Step.LOADING))
        return await self._supervise(run)

    async def _adopted(self, run: Running) -> Outcome:
        """Supervise an engine a previous daemon started (``Engine.begin_adoption`` set what
        it wants: an evict since then stands)."""
        e = self.e
        e.run = run
        e.log.start_following(from_end=True)
        e.stats.load_started = run.started_at
        self._set(S.STARTING, phase=Phase.of(Step.ADOPTING))
        return await self._supervise(run)

    async def _spawn(self, argv: list[str], env: dict[str, str], port: int, eid: str) -> Running:
        e = self.e
        plan = e.plan
        cmd, env = spawn.pinned(
            argv,
            env,
            cpus=plan.cpus if plan else (),
            mems=plan.numa_nodes if plan else (),
        )
        proc = await spawn.open_logged(
            e.log,
            cmd,
            env,
            note=f"starting: {subprocess.list2cmdline(argv)}",
            no_log=subprocess.PIPE,
        )
        info = proctree.read_stat(proc.pid)
        run = Running(
            digest=e.spec.launch_digest(),
            pid=proc.pid,
            start=info.start if info else 0,
            engine_id=eid,
            port=port,
            argv=argv,
            proc=proc,
        )
        self.host.state_changed(e)
        return run

    async def _pip_install_sglang(self, env: dict[str, str], kt_kernel: str | None) -> bool:
        """``auto_build`` (see ``spawn.pip_install_argv``), the log followed meanwhile."""
        e = self.e
        e.set_phase(Phase.of(Step.INSTALLING, f"pip install {KT_FORK}"))
        cmd = spawn.pip_install_argv(e.spec.python, kt_kernel)
        proc = await spawn.open_logged(
            e.log,
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
        e.log.poll()
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
        return now + max(0.0, self.e.spec.health_timeout - elapsed)

    async def _supervise(self, run: Running) -> Outcome:
        e = self.e
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
            if e.run is run and not self.host.keeping_engines:
                with trio.CancelScope(shield=True):
                    await self._kill_everything(run, grace=0.0)
        e.log.poll()
        return outcome

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
                e.set_phase(Phase.of(Step.LOADING, text))

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
        )

    async def _decide(self, run: Running, deadline: float) -> Outcome:
        e = self.e
        hang = self.host.settings.hang_timeout
        while True:
            if run.exited.is_set():
                return self._exit_outcome(run)
            if not e.want_up:
                await self._stop(run)
                return Outcome("stopped")
            if e.state == S.STARTING and self._health.healthy:
                self._became_ready(run)
            if e.state == S.STARTING and trio.current_time() >= deadline:
                if run.adopted_state == S.READY:
                    reason = f"hung: the adopted engine did not answer /health within {hang:g}s"
                    e.log.note(f"{reason}; killing the engine")
                    await self._kill_everything(run, grace=0.0)
                    return Outcome("crashed", reason)
                reason = f"not healthy within {e.spec.health_timeout:g}s (health_timeout); killed"
                await self._kill_everything(run, grace=self.host.settings.stop_grace)
                return Outcome("failed", reason)
            if e.state == S.READY and self._health.hung:
                reason = f"hung: /health did not answer 200 for {hang:g}s"
                e.log.note(f"{reason}; killing the engine")
                await self._kill_everything(run, grace=0.0)
                return Outcome("crashed", reason)
            wait = deadline - trio.current_time() if e.state == S.STARTING else math.inf
            await self._sleep_until_poked(max(wait, 0.0))

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
        self._set(S.READY)

    def _exit_outcome(self, run: Running) -> Outcome:
        e = self.e
        e.log.poll()
        outcome = classify_exit(
            run.returncode,
            was_ready=e.state == S.READY or run.adopted_state == S.READY,
            port=run.port,
            port_fixed=bool(e.spec.port),
            tail=e.log.last(80),
            log_path=str(e.log.path),
        )
        if outcome.kind == "exited":  # a clean exit nobody asked for: not a crash
            e.want_up = False
        return outcome

    async def _stop(self, run: Running) -> None:
        """Drain (bounded), then the stop sequence (``ktd.daemon.kill``)."""
        e = self.e
        # Serving: ready, or adopted from a previous daemon and not yet seen healthy here
        # (its streams may be running; a kill -9 of ktd must not cut them at the evict).
        serving = e.state == S.READY or e.adopting()
        if serving:
            # Off the gateway first (sglang-router): nothing new arrives while it drains.
            await self.host.before_drain(e)
        if serving and e.holding() and not e.force:
            timeout = e.drain_timeout
            if timeout is None:
                timeout = self.host.settings.drain_timeout
            text = f"waiting for {e.busy()} request(s)"
            self._set(S.DRAINING, phase=Phase.of(Step.DRAINING, text))
            with trio.move_on_after(timeout):
                while e.holding() and not e.force and not run.exited.is_set():
                    await self._sleep_until_poked()
            if e.holding():
                e.log.note(f"drain ended with {e.busy()} request(s) still running")
        self._set(S.STOPPING, phase=Phase.of(Step.TERMINATING))
        await self._kill_everything(run, grace=0.0 if e.force else self.host.settings.stop_grace)

    async def _kill_everything(self, run: Running, *, grace: float) -> None:
        e = self.e
        await kill.kill_tree(run, grace=grace, host=e.spec.host, note=e.log.note)
        e.log.stop_following()
        e.run = None
        e.plan = None
        if e.state == S.STOPPING:
            self._set(S.STOPPED)
        else:
            self.host.state_changed(e)
