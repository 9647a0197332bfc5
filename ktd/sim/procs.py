"""The server side of the scheduler child: spawn, wait for ready, watch, kill.

Why these choices:

* ``subprocess.Popen`` from the main thread, never ``trio.run_process``: trio
  starts processes from a worker thread, and ``PR_SET_PDEATHSIG`` fires when
  the *thread* that forked the child exits, so a cached worker thread idling
  out would kill the scheduler. Never ``multiprocessing`` fork either: SGLang
  spawns, and a forked trio process is undefined.
* A pipe carries the child's one ``ready`` line; the child then keeps the
  write end open until it dies, so EOF on the pipe is a cheap death notice
  (no polling, no pidfd needed).
* ``kill_tree`` walks ``/proc`` for descendants before killing, as SGLang's
  ``kill_process_tree`` walks psutil children. It spares a descendant that
  left our session (``KTD_SIM_ESCAPE``): that one emulates a process that
  escapes the engine's own clean-up too, so finding it is always ktd's job.
  It spares the helper of ``KTD_SIM_ORPHAN`` for the same reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from ktd.sim.scheduler import SIGTERM_LINE


def _package_root() -> str:
    """The directory that holds the ``ktd`` package, for the child's PYTHONPATH."""
    return str(Path(__file__).resolve().parents[2])


class Scheduler:
    """One scheduler child and the read end of its pipe."""

    def __init__(self, context_length: int, gpu_experts: int | None = None) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        root = _package_root()
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = root if not old else root + os.pathsep + old
        cmd = [
            sys.executable,
            "-m",
            "ktd.sim.scheduler",
            "--parent-pid",
            str(os.getpid()),
            "--ready-fd",
            str(write_fd),
            "--context-length",
            str(context_length),
        ]
        if gpu_experts is not None:  # the argv's --kt-num-gpu-experts (KTD_SIM_GPU_EXPERTS_MAX)
            cmd += ["--kt-num-gpu-experts", str(gpu_experts)]
        try:
            self.popen = subprocess.Popen(
                cmd, pass_fds=(write_fd,), env=env, stdin=subprocess.DEVNULL
            )
        finally:
            os.close(write_fd)
        self.pid = self.popen.pid
        self._read_fd: int | None = read_fd
        self._pipe: trio.lowlevel.FdStream | None = None
        self._buf = b""

    def _stream(self) -> trio.lowlevel.FdStream:
        if self._pipe is None:
            assert self._read_fd is not None
            self._pipe = trio.lowlevel.FdStream(self._read_fd)
            self._read_fd = None
        return self._pipe

    async def wait_ready(self) -> dict[str, object] | None:
        """The child's ``ready`` message, or None when it died first."""
        stream = self._stream()
        while b"\n" not in self._buf or self._buf.startswith(SIGTERM_LINE):
            # A SIGTERM before the ready line: the child says so and dies; EOF follows.
            data = await stream.receive_some(4096)
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    async def wait_exit(self) -> int:
        """Returns the child's exit status (``-N`` = killed by signal N) once it is gone."""
        stream = self._stream()
        while data := await stream.receive_some(4096):
            self._buf += data
        # EOF comes while the child exits; its status follows within microseconds.
        while True:
            code = self.popen.poll()
            if code is not None:
                return code
            await trio.sleep(0.005)

    def got_sigterm(self) -> bool:
        """Did a SIGTERM reach the child (it died of one, said so on the pipe, or has one
        pending)? A group SIGTERM queues one in every member before ``kill()`` returns, and
        the child writes its line on taking it, so this is certain at once, however late
        the child's death is noticed."""
        code = self.popen.poll()
        if code is not None:
            return code == -signal.SIGTERM
        if SIGTERM_LINE in self._buf + self._peek():
            return True
        try:
            with open(f"/proc/{self.pid}/status") as f:
                masks = [ln.split()[1] for ln in f if ln.startswith(("SigPnd:", "ShdPnd:"))]
        except OSError:
            return False
        return any(int(m, 16) & (1 << (signal.SIGTERM - 1)) for m in masks)

    def _peek(self) -> bytes:
        """What the pipe holds now, without waiting (kept for ``wait_exit``, which reads
        the rest). The pipe is non-blocking once ``wait_ready`` has opened its stream."""
        if self._pipe is None:
            return b""
        try:
            data = os.read(self._pipe.fileno(), 4096)
        except OSError:  # BlockingIOError: nothing there
            return b""
        self._buf += data
        return data

    def returncode(self) -> int | None:
        try:
            return self.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, parents before children, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


_ORPHAN = """
import signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1] == "ignore" else signal.SIG_DFL)
while True:
    signal.pause()
"""


def spawn_orphan(mode: str) -> subprocess.Popen[bytes]:
    """``KTD_SIM_ORPHAN``: a helper without PDEATHSIG, in our group and session, that
    outlives this process (re-parented to ktd, a child subreaper); ``mode`` "ignore"
    makes it ignore SIGTERM. Its own program (not a fork): its command line is not
    the server's, as with SGLang's children."""
    return subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, mode], stdin=subprocess.DEVNULL, close_fds=True
    )


def kill_tree(sched: Scheduler | None, spare: frozenset[int] = frozenset()) -> None:
    """SIGKILL every descendant in our session but ``spare``, then reap the scheduler."""
    sid = os.getsid(0)
    for pid in descendants(os.getpid()):
        if pid in spare:
            continue
        try:
            if os.getsid(pid) == sid:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if sched is not None:
        try:
            sched.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
