"""Process-tree facts from /proc, and the kill that leaves nothing behind.

SGLang's scheduler and detokenizer are children of the launch process; wrappers
sometimes ``setsid`` (llama-swap #804) and escape a group kill. So an engine is
its process group *plus* every descendant ever seen, *plus* orphans that the
kernel re-parents to ktd (ktd is a child subreaper). Pids are compared with
their start time so a recycled pid is never killed by mistake.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ktd.ports import pick_port as pick_port  # the daemon's modules find them here
from ktd.ports import port_free as port_free

PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    start: int  # clock ticks since boot: with pid, a unique identity
    state: str


def read_stat(pid: int) -> ProcInfo | None:
    try:
        data = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(b")") + 2 :].split()
    return ProcInfo(
        pid=pid,
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        start=int(rest[19]),
        state=rest[0].decode(),
    )


def all_procs() -> dict[int, ProcInfo]:
    procs: dict[int, ProcInfo] = {}
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            info = read_stat(int(entry.name))
            if info is not None:
                procs[info.pid] = info
    return procs


def descendants(root: int, procs: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    procs = all_procs() if procs is None else procs
    children: dict[int, list[ProcInfo]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info)
    out: list[ProcInfo] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child.pid)
    return out


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def _environ(pid: int | str) -> bytes | None:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _value(raw: bytes, key: str) -> str | None:
    """``key``'s value in a ``/proc/<pid>/environ`` text (NUL-separated ``K=V``)."""
    head = f"{key}=".encode()
    if raw.startswith(head):
        start = len(head)
    else:
        at = raw.find(b"\0" + head)
        if at < 0:
            return None
        start = at + 1 + len(head)
    end = raw.find(b"\0", start)
    return raw[start : end if end >= 0 else None].decode(errors="replace")


def environ_get(pid: int, key: str) -> str | None:
    """A variable from a process's initial environment (how ktd marks its engines)."""
    raw = _environ(pid)
    return None if raw is None else _value(raw, key)


def marked(key: str) -> dict[int, str]:
    """Every process whose initial environment sets ``key``: pid -> its value. One read
    of each process's ``environ`` and nothing else: the scans for ktd's marked processes
    (adoption, the tests' leak check after every test) read ``stat`` only of these few."""
    out = {}
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            raw = _environ(entry.name)
            value = None if raw is None else _value(raw, key)
            if value is not None:
                out[int(entry.name)] = value
    return out


def owned_by_us(pid: int) -> bool:
    """The process runs as our effective uid (``/proc/<pid>`` belongs to its euid).
    An engine marker in another user's process proves nothing: anyone can set a variable."""
    try:
        return os.stat(PROC / str(pid)).st_uid == os.geteuid()
    except OSError:
        return False


def environ_has(pid: int, key: str, value: str | None = None) -> bool:
    got = environ_get(pid, key)
    return got is not None and (value is None or got == value)


def start_of(pid: int) -> int | None:
    """The start time of the live process ``pid`` (clock ticks since boot), None when no
    process has that pid or it is a zombie."""
    info = read_stat(pid)
    return info.start if info is not None and info.state not in ("Z", "X") else None


def alive(ident: tuple[int, int]) -> bool:
    """True while the process (pid, start time) exists and is not a zombie."""
    info = read_stat(ident[0])
    return info is not None and info.start == ident[1] and info.state not in ("Z", "X")


def set_child_subreaper() -> bool:
    """Orphaned engine descendants get re-parented to us instead of init: we can find them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def signal_ident(ident: tuple[int, int], sig: int) -> None:
    """Signal a pid only if it is still the process we saw (pid reuse is real on busy boxes)."""
    info = read_stat(ident[0])
    if info is None or info.start != ident[1]:
        return
    try:
        os.kill(ident[0], sig)
    except ProcessLookupError:
        pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pids: Iterable[int]) -> None:
    """Collect zombies of orphans re-parented to us; never waitpid(-1) (trio owns its children)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError as exc:
            if exc.errno != errno.ECHILD:
                raise


def pidfd_of(ident: tuple[int, int]) -> int | None:
    """A pidfd of the process (pid, start time), readable once it exits; None when it
    is gone or replaced, or the kernel has no pidfds (before 5.3)."""
    try:
        fd = os.pidfd_open(ident[0])
    except (OSError, AttributeError):
        return None
    if alive(ident):  # checked after the open: the fd is of the process we saw
        return fd
    os.close(fd)
    return None
