"""The launch pipeline: from a wanted engine to a running process (probe, preflight,
place, command, key file, spawn).

Apart from the supervisor (``ktd.daemon.engine.supervisor``), which only decides *when* to
launch and what a launch's outcome means for the lifecycle: the pipeline is the one
part of an engine's life that starts a process, so it is what a test replaces to run
the real pool, placer and supervisors in-process (``tests.daemon.inpool``) with
stand-in engines. The supervisor is given a ``Launcher``; the daemon's is
``ProcessLauncher``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import trio

from ktd.core import doctor
from ktd.core.command import LaunchError, build_env, keyed_launch, with_key_file
from ktd.core.exits import Outcome
from ktd.core.states import Phase, Step
from ktd.daemon.engine import key as enginekey
from ktd.daemon.engine import preflight, proctree, spawn
from ktd.daemon.engine.engine import Busy, Engine, Running, Unplaceable
from ktd.daemon.engine.key import KeyDir, admin_key_of_argv
from ktd.daemon.engine.probe import KT_FORK, ProbeResult, missing_message
from ktd.daemon.safedir import UnsafeDir

#: The engine's log followed meanwhile (the supervisor's tail: a long install shows).
FollowLog = Callable[[], Awaitable[None]]


class Launcher(Protocol):
    """What the supervisor asks of a launch: the engine's run, or why there is none."""

    async def launch(self, e: Engine, follow_log: FollowLog) -> Running | Outcome:
        """Start ``e`` (its ``plan`` set on the way): its ``Running`` (``sleeps`` set),
        or the ``Outcome`` that ended the launch (``e.plan`` then None)."""
        ...


async def placed(e: Engine) -> Outcome | None:
    """Placement (``e.plan``, from the pool's placer): None when the engine may start.
    Shared by every launcher: placement is the pool's, whatever starts the process."""
    e.set_phase(Phase.of(Step.PLACING))
    try:
        e.plan = await e.host.place(e)
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
        return Outcome("stopped", "stopped before launch")
    return None


class ProcessLauncher:
    """The daemon's launcher: the model's interpreter probed, SGLang's command built,
    the engine started as a process of its own (pinned, logged, keyed)."""

    async def launch(self, e: Engine, follow_log: FollowLog) -> Running | Outcome:
        probe = await self._probed(e, follow_log)
        if isinstance(probe, Outcome):
            return probe
        e.catalog = probe.catalog
        kt_note = doctor.kt_spin_note(probe.kt_kernel) if e.spec.sleep else None
        if not e.want_up:
            return Outcome("stopped", "stopped before launch")
        refused = await self._preflight(e, probe) or await placed(e)
        if refused is not None:
            return refused
        return await self._started(e, kt_note)

    async def _probed(self, e: Engine, follow_log: FollowLog) -> ProbeResult | Outcome:
        """What the model's interpreter has (SGLang, kt-kernel, the flags SGLang knows),
        after a ``pip install`` of the kt fork when the model asks for one and none is
        there; a failed ``Outcome`` when something it needs is missing."""
        host = e.host
        env = build_env(e.spec, host.base_env)
        probe = await host.prober.probe(e.spec.python, env)
        if e.spec.auto_build and probe.ok_python and probe.sglang is None:
            problem = missing_message(probe, auto_build=True)
            if problem:
                return Outcome("failed", problem)
            built = await self._pip_install_sglang(e, env, probe.kt_kernel, follow_log)
            if not built:
                return Outcome("failed", f"`pip install {KT_FORK}` failed; see the log")
            host.prober.forget()
            probe = await host.prober.probe(e.spec.python, env)
        problem = missing_message(probe, auto_build=False)
        return Outcome("failed", problem) if problem else probe

    async def _preflight(self, e: Engine, probe: ProbeResult) -> Outcome | None:
        """Preflight comes before placement: placing may evict ready engines, and a load
        that cannot start must never cost a running model. Among its checks: a flag the
        installed SGLang would refuse (its catalogue, from the probe)."""
        e.set_phase(Phase.of(Step.PREFLIGHT))
        refusal = await preflight.run(e.spec, probe)
        return Outcome("failed", refusal) if refusal else None

    async def _started(self, e: Engine, kt_note: str | None) -> Running | Outcome:
        """The placed engine's command, its key file, its process."""
        host = e.host
        port = e.spec.port or proctree.pick_port(e.spec.host)
        flags = e.plan.argv_flags() if e.plan else []
        try:
            launch, keyed = keyed_launch(e.launch_spec(), port, flags, e.catalog)
        except LaunchError as exc:
            e.plan = None
            return Outcome("failed", str(exc))
        argv = launch.argv
        notes = (keyed.note, kt_note)
        e.launch_notes = launch.notes + tuple(n for n in notes if n)
        engine_id = f"{host.instance}/{e.alias}@{time.time_ns()}"
        env = build_env(
            e.spec,
            host.base_env,
            e.plan.env if e.plan else None,
            engine_id=engine_id,
            digest=e.spec.launch_digest(),
            sleeps=launch.sleeps,
        )
        key, key_file = keyed.user_key, None
        admin = keyed.admin_key or (enginekey.new_key() if keyed.own_admin else None)
        if keyed.config:
            key = keyed.user_key or enginekey.new_key()
            try:
                key_file = await host.offload(host.key_dir.write, e.alias, key, admin)
            except (OSError, UnsafeDir) as exc:
                e.plan = None
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                return Outcome("failed", f"cannot write the engine's key file: {why}")
            argv = with_key_file(argv, str(key_file))
        try:
            run = await self._spawn(e, argv, env, port, engine_id, key=key, key_file=key_file)
            run.admin_key = admin
        except BaseException as exc:
            KeyDir.remove(key_file)  # nothing runs that would read it
            if not isinstance(exc, OSError):
                raise
            e.plan = None
            return Outcome("failed", f"cannot start {argv[0]}: {exc.strerror or exc}")
        run.sleeps = launch.sleeps
        return run

    async def _spawn(
        self,
        e: Engine,
        argv: list[str],
        env: dict[str, str],
        port: int,
        eid: str,
        *,
        key: str | None = None,
        key_file: Path | None = None,
    ) -> Running:
        plan = e.plan
        e.log.redact(key)  # SGLang logs its server_args, the key among them, at once
        e.log.redact(admin_key_of_argv(argv))
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
            api_key=key,
            key_file=key_file,
        )
        e.host.state_changed(e)
        return run

    async def _pip_install_sglang(
        self, e: Engine, env: dict[str, str], kt_kernel: str | None, follow_log: FollowLog
    ) -> bool:
        """``auto_build`` (see ``spawn.pip_install_argv``), the log followed meanwhile."""
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
                n.start_soon(follow_log)
                code = await proc.wait()
                n.cancel_scope.cancel()
        finally:
            if proc.returncode is None:
                proctree.signal_group(proc.pid, signal.SIGKILL)
                with trio.CancelScope(shield=True):
                    await proc.wait()
        e.log.poll()
        return code == 0
