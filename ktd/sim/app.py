"""The sim's life, in SGLang's order: parse, spawn the scheduler, load, bind, warm up, serve, drain.

Why this order matters to ktd (docs/sglang.md, "Start-up and readiness"):

1. The scheduler child is spawned first and "loads" the model; the HTTP port
   is *not* bound during the load, so a busy port is found only afterwards
   (uvicorn's ``[Errno 98] ... address already in use``, exit 1).
2. Until the load ends SIGTERM has its default action: the process dies at
   once (the child follows through PDEATHSIG). After it, SIGTERM drains:
   ``/health`` turns 503 (new generations are still accepted), in-flight ones
   get up to ``KTD_SIM_DRAIN`` seconds, then the process tree is killed and the
   server exits as SGLang does (see ``_drain``).
3. After the bind ``/v1/models`` answers at once, ``/health`` only after the
   warm-up (``KTD_SIM_WARMUP``), when "The server is fired up and ready to
   roll!" is logged.

A scheduler that dies on its own takes the server down (exit 1), as SGLang's
SIGQUIT from a failed child does; one killed by SIGTERM (a group SIGTERM) is
a crash to SGLang too: it waits for crash diagnostics, then kills its tree.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import FrameType

import trio

from ktd.sim import flags, record
from ktd.sim.cli import SimArgs, parse, server_args_repr
from ktd.sim.httpd import HttpServer
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import line_buffered, log, uvicorn
from ktd.sim.procs import Scheduler, kill_tree, spawn_orphan
from ktd.sim.routes import SimApp
from ktd.sim.state import DRAINING, STARTING, UP, ServerState


class Recorder:
    """``KTD_SIM_RECORD``: written at start-up, rewritten with more fields when ready."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.extra: dict[str, object] = {}

    def write(self, **more: object) -> None:
        if not self.path:
            return
        self.extra.update(more)
        try:
            record.write(self.path, record.snapshot(self.extra))
        except OSError as exc:
            log(f"sim: cannot write KTD_SIM_RECORD={self.path}: {exc}")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def install_handlers(signums: Iterable[int], callback: Callable[[int], None]) -> None:
    """Run ``callback(signum)`` in trio for each signal; ignore signals once trio is done.

    Why not ``trio.open_signal_receiver``: closing a receiver re-raises the
    signals it had not yet handed out, under the restored default handler, so a
    SIGTERM landing while the drain finishes would kill the process (-15)
    instead of letting it exit 0. ``run_sync_soon`` is safe in a signal handler.
    """
    token = trio.lowlevel.current_trio_token()

    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            token.run_sync_soon(callback, signum)
        except trio.RunFinishedError:
            pass  # already exiting

    for signum in signums:
        signal.signal(signum, handler)


class SimLifecycle:
    def __init__(self, args: SimArgs, knobs: Knobs, sched: Scheduler, rec: Recorder) -> None:
        self.args = args
        self.knobs = knobs
        self.sched = sched
        self.rec = rec
        self.state = ServerState(hold=knobs.hold)
        self.app = SimApp(args, knobs, self.state, die=self._scheduler_died)
        self.app.memory.on_change = lambda info: self.rec.write(memory=info)
        self.exit_code = 0
        self._crashing = False
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery

    def exit(self, code: int) -> None:
        self.exit_code = code
        self._scope.cancel()

    async def run(self) -> int:
        # SIGUSR1 from start-up on: its default action would kill the process.
        install_handlers([signal.SIGUSR1], self._on_sigusr1)
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if await self._load():
                    # From here on SIGTERM drains; during the load it killed at once.
                    stop = [signal.SIGINT]
                    if not self.knobs.ignore_sigterm:
                        stop.append(signal.SIGTERM)
                    install_handlers(stop, self._on_stop_signal)
                    listeners = await self._bind()
                    if listeners is None:
                        self.exit(1)
                    else:
                        server = HttpServer(self.app.handle, access_log=self.args.access_log)
                        nursery.start_soon(trio.serve_listeners, server.serve, listeners)
                        nursery.start_soon(self._warmup)
                        nursery.start_soon(self._watch_scheduler)
                else:
                    self.exit(1)
        return self.exit_code

    async def _load(self) -> bool:
        """Wait for the scheduler's ``ready``; False (after SGLang's messages) if it died."""
        ready = await self.sched.wait_ready()
        if ready is None:
            code = self.sched.returncode()
            log("Rank 0 scheduler is dead. Please check if there are relevant logs.")
            log(f"Exit code: {code}")
            try:
                raise RuntimeError("Initialization failed. Please see the error messages above.")
            except RuntimeError:
                traceback.print_exc()
            return False
        for key in ("max_total_num_tokens", "max_req_input_len"):
            if key in ready:
                self.app.scheduler_info[key] = ready[key]
        self.rec.write(escaped_pid=ready.get("escaped_pid"))
        return True

    async def _bind(self) -> list[trio.SocketListener] | None:
        host, port = self.args.host, self.args.port
        uvicorn("INFO", f"Started server process [{os.getpid()}]")
        uvicorn("INFO", "Waiting for application startup.")
        uvicorn("INFO", "Application startup complete.")
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            errno = exc.errno or 0
            why = os.strerror(errno).lower() if errno > 0 else str(exc)
            address = (host, port)
            uvicorn(
                "ERROR",
                f"[Errno {errno}] error while attempting to bind on address {address!r}: {why}",
            )
            uvicorn("INFO", "Waiting for application shutdown.")
            uvicorn("INFO", "Application shutdown complete.")
            return None
        bound = listeners[0].socket.getsockname()[1]
        self.rec.write(port=bound, memory=self.app.memory.info())
        uvicorn(
            "INFO", f"Uvicorn running on http://{_url_host(host)}:{bound} (Press CTRL+C to quit)"
        )
        return listeners

    async def _warmup(self) -> None:
        await trio.sleep(self.knobs.warmup)
        if self.state.status == STARTING:
            self.state.status = UP
            log("The server is fired up and ready to roll!")
        if self.knobs.hang_after is not None:
            await trio.sleep(self.knobs.hang_after)
            log(f"sim: KTD_SIM_HANG_AFTER={self.knobs.hang_after}: every request hangs from now")
            self.state.set_hung(True)

    def _on_sigusr1(self, signum: int) -> None:
        self.state.set_hung(not self.state.hung)
        now = "hang" if self.state.hung else "are answered again"
        log(f"sim: SIGUSR1: requests {now}")

    def _on_stop_signal(self, signum: int) -> None:
        if self.state.status != DRAINING:
            self._begin_drain(signum)
        elif signum == signal.SIGINT:
            log("sim: SIGINT while draining: exiting now")
            self.exit(0)
        else:
            log("sim: SIGTERM while draining: already shutting down")

    def _begin_drain(self, signum: int) -> None:
        name = signal.Signals(signum).name
        log(f"{name} received. signum={signum} frame=None. Draining requests and shutting down...")
        self.state.status = DRAINING
        self._nursery.start_soon(self._drain)

    async def _drain(self) -> None:
        """SGLang's exit statuses after SIGTERM (docs/sglang.md, "Processes"): its drain
        handler is installed at the first request through the tokenizer manager (a /health
        is one), so before that uvicorn's shutdown re-raises SIGTERM (the process dies of
        it: -15, a shell's 143); after it, upstream drains and exits 0, and the kt fork
        SIGKILLs its own tree (-9)."""
        with trio.move_on_after(self.knobs.drain):
            await self.state.wait_idle()
        if self.sched.got_sigterm():  # the whole group was signalled: a crash to SGLang
            await self._scheduler_crashed(-signal.SIGTERM)
            return
        log(f"Gracefully exiting... Remaining number of requests {self.state.stats.active}.")
        if not self.state.drain_handler:
            self.exit(-signal.SIGTERM)
        elif flags.flavor() == "kt":
            log(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True")
            self.exit(-signal.SIGKILL)
        else:
            self.exit(0)

    def _scheduler_died(self, output: str, exit_code: int | None) -> None:
        """The scheduler dies of a memory call (memory.py). ``exit_code`` None: it raised
        (a release with a request in flight, a resume of what is not released); its
        ``except`` logs the traceback and SIGQUITs the server, whose running-phase
        handler (installed with the tokenizer manager's loop, called without arguments)
        kills the whole tree, itself included: -9. ``exit_code`` 1: torch_memory_saver
        called ``exit(1)``; upstream's subprocess watchdog notices and SIGQUITs the
        server alike, the fork has no watchdog and is left serving with no scheduler:
        everything that needs one hangs from now."""
        pid = os.getpid()
        if exit_code is None:
            log(f"Scheduler hit an exception: {output}", " TP0")
        else:
            try:
                sys.stderr.write(output + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            if flags.flavor() == "kt":
                log("sim: the scheduler is gone and nothing notices: every request hangs")
                self.state.set_hung(True)
                return
            log(f"Subprocess scheduler_0 (pid={self.sched.pid}) crashed with exit code "
                f"{exit_code}. Triggering SIGQUIT for cleanup...")  # fmt: skip
        log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        if flags.flavor() == "upstream":
            log(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
        self.exit(-signal.SIGKILL)

    async def _scheduler_crashed(self, code: int) -> None:
        """A group SIGTERM (what ktd once sent): SGLang sees its scheduler die first,
        reports a crash, waits for crash diagnostics, then kills its own tree."""
        if self._crashing:
            return
        self._crashing = True
        log(f"Subprocess scheduler_0 crashed with exit code {code}. Triggering SIGQUIT "
            "for cleanup...")  # fmt: skip
        log(f"Waiting {self.knobs.crash_diag:g}s before crash diagnostics")
        await trio.sleep(self.knobs.crash_diag)
        self.exit(-signal.SIGKILL)

    async def _watch_scheduler(self) -> None:
        code = await self.sched.wait_exit()
        if code == -signal.SIGTERM:
            await self._scheduler_crashed(code)
            return
        if self.state.status == DRAINING:
            return
        log(f"sim: scheduler process {self.sched.pid} exited unexpectedly (exit code {code}).")
        log("Received sigquit from a child process. It usually means the child failed.")
        self.exit(1)


async def _amain(args: SimArgs, knobs: Knobs, sched: Scheduler, rec: Recorder) -> int:
    return await SimLifecycle(args, knobs, sched, rec).run()


def raise_nofile_limit(target: int = 65535) -> None:
    """SGLang's ``set_ulimit``: 1,000 concurrent streams need more than 1,024 descriptors."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = target if hard == resource.RLIM_INFINITY else min(target, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as exc:
        log(f"sim: cannot raise RLIMIT_NOFILE: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    line_buffered()
    args = parse(argv)
    knobs, warnings = Knobs.from_env()
    if knobs.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the scheduler
    log(f"server_args={server_args_repr(args)}")
    for warning in warnings:
        log(f"sim: {warning}")
    raise_nofile_limit()
    rec = Recorder(knobs.record)
    sched: Scheduler | None = None
    spare: frozenset[int] = frozenset()
    try:
        if knobs.orphan:
            orphan = spawn_orphan(knobs.orphan)
            spare = frozenset({orphan.pid})
            log(f"sim: KTD_SIM_ORPHAN={knobs.orphan}: helper pid {orphan.pid} will outlive us")
            rec.write(orphan_pid=orphan.pid)
        sched = Scheduler(args.context_length, args.server_args.get("kt_num_gpu_experts"))
        rec.write(scheduler_pid=sched.pid)
        code = trio.run(_amain, args, knobs, sched, rec)
    except KeyboardInterrupt:
        return 130
    finally:
        kill_tree(sched, spare)
        sys.stdout.flush()
    if code < 0:  # die of the signal, as SGLang does, so the parent sees -N
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code
