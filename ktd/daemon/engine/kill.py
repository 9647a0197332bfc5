"""Stopping one engine's whole process tree, and nothing else.

Apart from the supervisor because it is the riskiest code of the daemon (signals to
pids) and wants to be read alone: what counts as the engine's (``members``), which
of them is SGLang's server process (``server_of``), and the driver that carries out
the stop sequence of ``ktd.core.stop`` (decided there: SIGTERM to the server, its
drain bounded by the grace, then SIGTERM and SIGKILL to what is left). Every signal
is checked against the process's start time, so a recycled pid is never hit.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import trio

from ktd.core import stop
from ktd.core.command import ENGINE_MARK
from ktd.core.exits import CLEAN_STOP
from ktd.daemon.engine import proctree
from ktd.daemon.engine.running import Running

__all__ = ["kill_tree", "members", "server_of", "signal_group", "stopped_note"]

Ident = tuple[int, int]  # (pid, start time)
POLL = 0.01  # seconds between cheap looks at the known members (one stat read each)


def members(run: Running) -> set[Ident]:
    """Every process of this engine: its main process and descendants (while the main
    process is the one we started or verified), and any process carrying its marker
    (a descendant that escaped with setsid and was orphaned). Never a process by its
    group or session alone: a recycled pid's group is someone else's."""
    procs = proctree.all_procs()
    found: set[Ident] = set()
    root = procs.get(run.pid)
    if root is not None and root.start == run.start:
        found.add((root.pid, root.start))
        found.update((d.pid, d.start) for d in proctree.descendants(run.pid, procs))
    me = os.getpid()
    for info in procs.values():
        if (
            info.pid != me
            and proctree.environ_has(info.pid, ENGINE_MARK, run.engine_id)
            and proctree.owned_by_us(info.pid)
        ):
            found.add((info.pid, info.start))
    return found


def server_of(run: Running, found: set[Ident]) -> Ident:
    """SGLang's server process among ``found`` (``stop.find_server``: found by the
    launch command line, so a wrapper interpreter is no obstacle); else the main one."""
    rows = []
    starts = {}
    for pid, start in found:
        info = proctree.read_stat(pid)
        if info is not None and info.start == start and info.state not in ("Z", "X"):
            rows.append((pid, info.ppid, proctree.cmdline(pid)))
            starts[pid] = start
    pid = stop.find_server(rows, run.pid, run.argv)
    return (pid, starts.get(pid, run.start))


def signal_group(run: Running, sig: int) -> None:
    """The engine's process group, only while its verified main process leads it."""
    if proctree.alive((run.pid, run.start)):
        proctree.signal_group(run.pid, sig)


def stopped_note(code: int | None, *, pid: int, terminated: bool, killed: bool) -> str:
    """The log line that ends a run. An adopted engine is not our child: its exit
    status is not ours to read, and that it exited on SIGTERM before the grace ran
    out is all there is to know."""
    clean = terminated and not killed and (code is None or code in CLEAN_STOP)
    return (
        ("stopped cleanly by SIGTERM" if clean else "stopped")
        + f" (pid {pid}"
        + (f", exit {code}" if code is not None else ", adopted: exit status not ours")
        + ")"
    )


async def kill_tree(
    run: Running,
    *,
    grace: float,
    host: str,
    note: Callable[[str], None],
    follow: float = stop.FOLLOW,
    kill_bound: float = stop.KILL_BOUND,
) -> None:
    """Stop the engine (``stop.StopMachine``: SIGTERM to its server when ``grace`` > 0,
    at most ``grace`` for its drain, then ``follow`` for the rest before SIGKILL); when a
    member outlived that, wait a while for the engine's port (on ``host``) to be free.
    ``note`` writes the engine log."""
    driver = _Driver(run, note)
    machine = stop.StopMachine(grace, follow=follow, kill_bound=kill_bound)
    try:
        done = await driver.drive(machine)
    finally:
        driver.close()
    if done.left:
        left = " ".join(str(pid) for pid, _ in driver.alive(stop.Target.ALL))
        note(f"still alive {kill_bound:g}s after SIGKILL, left behind: pid {left}")
    if run.proc is not None and run.returncode is None:
        with trio.move_on_after(5):
            run.returncode = await run.proc.wait()
    run.exited.set()
    run.close()
    if done.left:
        # A member that outlived its SIGKILL (stuck in the kernel) may still hold the
        # port a restart on a fixed port needs. With the whole tree gone no socket of
        # the engine's is left, so a port still taken is someone else's (the port
        # taken before the engine bound it): waiting for it would delay the retry on
        # another port for nothing.
        with trio.move_on_after(10):
            while not proctree.port_free(host, run.port):
                await trio.sleep(POLL)
    note(stopped_note(run.returncode, pid=run.pid, terminated=done.terminated, killed=done.killed))


class _Driver:
    """Carries out a ``StopMachine``'s actions on the engine's processes. The members
    known so far are looked at cheaply (a stat read each); a full scan (every
    process's environment) happens at the start and when the machine asks for one."""

    def __init__(self, run: Running, note: Callable[[str], None]) -> None:
        self.running = run
        self.note = note
        self.found = members(run)
        self.server = server_of(run, self.found)
        self._pidfd: int | None = None
        self._pidfd_tried = False

    async def drive(self, machine: stop.StopMachine) -> stop.Done:
        seen = self._look(full=True)
        while True:
            action = machine.step(seen)
            full = False
            if isinstance(action, stop.Done):
                return action
            if isinstance(action, stop.Send):
                self._send(action)
            elif isinstance(action, stop.ObserveAt):
                await self._wait(action)
            else:
                self.found |= members(self.running)
                full = True
            seen = self._look(full=full)

    def _look(self, *, full: bool) -> stop.Observed:
        # Orphans re-parented to ktd (a child subreaper) are ours to reap; the main
        # process is trio's.
        proctree.reap(pid for pid, _ in self.found if pid != self.running.pid)
        return stop.Observed(
            now=trio.current_time(),
            server=proctree.alive(self.server),
            others=len(self.alive(stop.Target.REST)),
            full=full,
        )

    def alive(self, to: stop.Target) -> list[Ident]:
        if to is stop.Target.SERVER:
            return [self.server] if proctree.alive(self.server) else []
        skip = self.server if to is stop.Target.REST else None
        return [m for m in self.found if m != skip and proctree.alive(m)]

    def _send(self, action: stop.Send) -> None:
        targets = self.alive(action.to)
        name = action.sig.name
        if action.to is stop.Target.SERVER:
            pid, root = self.server[0], self.running.pid
            if pid == root:
                # SGLang's designed shutdown: SIGTERM to the server process only (a
                # group SIGTERM kills the scheduler first: SGLang's crash path).
                self.note(f"{name} to the engine's main process {pid}")
            else:
                self.note(
                    f"{name} to SGLang's server process {pid} (the engine's main process "
                    f"{root} runs it: a wrapper interpreter)"
                )
        elif action.why:
            self.note(f"{name} to {len(targets)} process(es) {action.why}")
        elif action.sig == signal.SIGTERM and targets:
            self.note(f"{name} to {len(targets)} process(es) left after the server exited")
        if action.to is stop.Target.ALL and action.sig == signal.SIGKILL:
            signal_group(self.running, signal.SIGKILL)
        for ident in targets:
            if ident[0] == self.running.pid and self.running.proc is not None:
                if self.running.proc.returncode is None:  # trio holds it: no recycled pid
                    self.running.proc.send_signal(action.sig)
            else:
                proctree.signal_ident(ident, action.sig)

    async def _wait(self, action: stop.ObserveAt) -> None:
        left = action.until - trio.current_time()
        if left <= 0:
            return
        fd = self._server_pidfd() if action.on_server else None
        if fd is None:
            await trio.sleep(min(left, POLL if not action.on_server else 0.05))
            return
        with trio.move_on_after(left):
            await trio.lowlevel.wait_readable(fd)

    def _server_pidfd(self) -> int | None:
        """A pidfd of the server process: its exit is an event (Linux >= 5.3)."""
        if not self._pidfd_tried:
            self._pidfd_tried = True
            self._pidfd = proctree.pidfd_of(self.server)
        return self._pidfd

    def close(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
