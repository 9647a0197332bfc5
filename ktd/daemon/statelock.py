"""One daemon per state dir: an ``flock`` on ``<state dir>/ktd.lock``, held for life.

Two daemons on one state dir (a second ``ktd serve`` with another ``--socket``)
would both adopt the same engines, overwrite each other's state file and kill
each other's engines on the way out. The socket check cannot see that; the
lock can. It is an advisory ``flock`` on an open file description: the kernel
drops it when the daemon dies however it dies (``kill -9`` included), so a
stale lock never blocks a restart. The file holds the holder's pid, for the
error message only. The fd is close-on-exec: an engine must never inherit the
lock (a surviving engine would then block every later daemon).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "ktd.lock"


class StateDirBusy(Exception):
    """Another live process holds the lock; ``pid`` is what its lock file says (0: unknown)."""

    def __init__(self, path: Path, pid: int) -> None:
        who = f"pid {pid}" if pid else "a process whose pid is not recorded yet"
        super().__init__(
            f"ktd: state dir {path.parent} is in use by another ktd ({who}; lock {path}); "
            "one daemon per state dir: stop it, or give this one another KTD_STATE_DIR"
        )
        self.pid = pid


def acquire(state_dir: Path, dir_fd: int | None = None) -> int:
    """Take the lock or raise ``StateDirBusy`` at once (never waits). Returns the fd,
    which the caller keeps open for as long as it is the daemon."""
    path = state_dir / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(LOCK_NAME if dir_fd is not None else path, flags, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise StateDirBusy(path, holder) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full disk must not stop the daemon: the pid is for messages only
    return fd


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0
