"""Create and check ktd's own directories without following symlinks.

The runtime dir holds the control socket: whoever controls that directory
controls what ``ktctl`` talks to. A symlink planted at its path used to be
followed (the *target* chmod-ed to 0700 and the sockets bound in it, and a
later swap of the link redirected every client). So the last component is
created with ``mkdir`` (which never follows a link) and then opened with
``O_NOFOLLOW | O_DIRECTORY``; owner and mode are checked on that fd, and a
mode change, when one is due, is an ``fchmod`` of that fd, never of a path.
Anything unexpected is a start-up error that says what to fix.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class UnsafeDir(Exception):
    """A directory ktd must not use; the message says why and what to do."""


def ensure_dir(path: Path, mode: int, *, what: str, fix_mode: bool) -> int:
    """``path`` as a real directory owned by us with permissions ``mode``; returns an fd
    on it (O_DIRECTORY, close-on-exec) for the caller to use or close.

    Missing parents are created normally (they are the system's: /run, ~/.local/state).
    A parent anyone may write to without the sticky bit could swap our directory under
    us: refused. A directory of ours that others may write to is refused (they could
    have planted anything in it). ``fix_mode``: one that is merely not ``mode`` (0750
    vs 0700) is set to it through the fd (the runtime dir: its mode *is* the socket's
    access control); otherwise it is left as the operator made it (the state dir).
    """
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        pst = os.stat(parent)
    except OSError as exc:
        raise UnsafeDir(f"{what} {path}: cannot create parent {parent}: {exc.strerror}") from None
    if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
        raise UnsafeDir(
            f"{what} {path}: parent {parent} is writable by everyone without the sticky bit "
            f"(mode {stat.S_IMODE(pst.st_mode):04o}); anyone could replace {path.name}"
        )
    created = False
    try:
        os.mkdir(path, mode)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeDir(f"{what} {path}: cannot create: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symlink" if os.path.islink(path) else "not a directory"
            raise UnsafeDir(
                f"{what} {path} is {kind}; refusing to follow it "
                f"(remove it, or point the setting at a real directory owned by uid "
                f"{os.geteuid()})"
            ) from None
        raise UnsafeDir(f"{what} {path}: cannot open: {exc.strerror}") from None
    try:
        check_fd(fd, path, mode, what=what, fix_mode=fix_mode, created=created)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_fd(
    fd: int, path: Path, mode: int, *, what: str, fix_mode: bool, created: bool = False
) -> None:
    st = os.fstat(fd)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeDir(
            f"{what} {path} is owned by uid {st.st_uid}, not by us (uid {uid}); refusing "
            f"(chown it, or choose another directory)"
        )
    have = stat.S_IMODE(st.st_mode)
    if have == mode:
        return
    if have & (stat.S_IWGRP | stat.S_IWOTH) and not created:
        # Others could have put anything in it already; tightening now would not undo that.
        raise UnsafeDir(
            f"{what} {path} has mode {have:04o}: writable by others; refusing "
            f"(check its contents, then chmod {mode:o} {path})"
        )
    if fix_mode or created:
        os.fchmod(fd, mode)
