"""Wake on file writes without polling: a minimal inotify binding for trio (Linux).

ktd follows every engine's log file; polling would cost CPU on an idle box
and latency on a busy one (the "ready to roll" line should turn into a ready
state at once). Falls back to ``None`` where inotify is unavailable.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import trio

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
#: A directory's entries come and go (a socket file removed, renamed or replaced).
DIR_CHANGES = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


class FileWatch:
    """Readable whenever the watched file is written to (or truncated)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, path: Path, mask: int = IN_MODIFY | IN_ATTRIB) -> FileWatch | None:
        """Watch ``path`` for ``mask`` (a file's writes by default; ``DIR_CHANGES`` for
        a directory's entries)."""
        if _libc is None:
            return None
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None
        if _libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            os.close(fd)
            return None
        return cls(fd)

    async def wait(self) -> None:
        """Until the next write; coalesces whatever piled up."""
        while True:
            try:
                if os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                pass
            await trio.lowlevel.wait_readable(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)
            self.fd = -1
