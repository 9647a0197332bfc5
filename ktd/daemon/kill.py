"""Stopping one engine's whole process tree, and nothing else.

Apart from the supervisor because it is the riskiest code of the daemon (signals to
pids) and wants to be read alone: what counts as the engine's (``members``), how it
is asked to go (SIGTERM to the main process), and how what is left is made to go
(SIGKILL to every member, then a confirming scan for late forks).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import trio

from ktd.core.command import ENGINE_MARK
from ktd.core.exits import CLEAN_STOP
from ktd.daemon import proctree
from ktd.daemon.running import Running

__all__ = ["kill_tree", "members", "signal_group", "stopped_note"]


def members(run: Running) -> set[tuple[int, int]]:
    """Every process of this engine: its main process and descendants (while the main
    process is the one we started or verified), and any process carrying its marker
    (a descendant that escaped with setsid and was orphaned). Never a process by its
    group or session alone: a recycled pid's group is someone else's."""
    procs = proctree.all_procs()
    found: set[tuple[int, int]] = set()
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


async def kill_tree(run: Running, *, grace: float, host: str, note: Callable[[str], None]) -> None:
    """SIGTERM (when ``grace`` > 0), wait ``grace``, SIGKILL every member left; then
    wait for the engine's port (on ``host``) to be free. ``note`` writes the engine log."""
    found = members(run)
    terminated = killed = False
    if found or not run.exited.is_set():
        if grace > 0 and not run.exited.is_set():
            terminated = True
            # SGLang's designed shutdown: SIGTERM to the main process only. It drains,
            # exits, and its scheduler/detokenizer follow by PDEATHSIG. SIGTERM to the
            # whole group kills the scheduler first, and SGLang then reports a crash,
            # SIGQUITs itself and sleeps 5 s "before crash diagnostics".
            note(f"SIGTERM to the engine's main process {run.pid}")
            if run.proc is not None and run.proc.returncode is None:
                run.proc.send_signal(signal.SIGTERM)
            else:
                proctree.signal_ident((run.pid, run.start), signal.SIGTERM)
            # The main process's exit is an event; the known rest is polled cheaply
            # (a full /proc scan with environ reads costs ms on a busy box).
            with trio.move_on_after(grace):
                await run.exited.wait()
                while any(map(proctree.alive, found)):
                    await trio.sleep(0.01)
        found |= members(run)
        leftover = {m for m in found if proctree.alive(m)}
        if leftover or not run.exited.is_set():
            killed = True
            if grace > 0:
                note(f"SIGKILL to {len(leftover)} process(es) left after {grace:g}s")
            signal_group(run, signal.SIGKILL)
            for ident in leftover:
                proctree.signal_ident(ident, signal.SIGKILL)
        await _reap_all(run, found)
    if run.proc is not None and run.returncode is None:
        with trio.move_on_after(5):
            run.returncode = await run.proc.wait()
    run.exited.set()
    run.close()
    with trio.move_on_after(10):
        while not proctree.port_free(host, run.port):
            await trio.sleep(0.01)
    note(stopped_note(run.returncode, pid=run.pid, terminated=terminated, killed=killed))


async def _reap_all(run: Running, found: set[tuple[int, int]]) -> None:
    """SIGKILL and reap until every member is gone (bounded: 10 s)."""
    with trio.move_on_after(10):
        while True:
            proctree.reap(pid for pid, _ in found if pid != run.pid)
            left = [m for m in found if proctree.alive(m)]
            # Not the exited event alone: from _supervise's finally the task
            # that sets it is gone (a zombie main process counts as gone).
            main_gone = run.exited.is_set() or not proctree.alive((run.pid, run.start))
            if not left and main_gone:
                # Confirm with a full scan: a process forked meanwhile is not
                # in ``found`` yet.
                late = {m for m in members(run) if proctree.alive(m)} - found
                if not late:
                    break
                found |= late
                left = list(late)
            for ident in left:
                proctree.signal_ident(ident, signal.SIGKILL)
            await trio.sleep(0.01)
