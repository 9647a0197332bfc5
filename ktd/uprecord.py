"""Where a running ``ktd up`` serves: a small record ktctl reads (issue 43).

``ktd up --demo`` runs its daemon on a socket under its own temporary directory, and
``ktd up`` on whatever runtime dir its config names: neither is where ``ktctl`` looks
by default, and a new user's ``ktctl status`` said "ktd is not running" beside a
running demo. ``ktd up`` writes this record (its pid, its control socket, its
frontend) once its daemon answers and removes it when it stops; ``ktctl`` reads it
when nothing answers where it looks by default (``ktctl/discover.py``).

The record is per user, in a place only that user (or root) writes:
``$XDG_RUNTIME_DIR/ktd-up.json``, else ``/run/ktd-up.json`` as root, else
``/tmp/ktd-up-<uid>.json``. A record is believed only when it is a regular file owned
by the reader's uid, its pid is alive and its socket is a socket: a stale one (a
``ktd up`` killed by SIGKILL) is ignored. Light on purpose: ktctl imports it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NAME = "ktd-up.json"


@dataclass(frozen=True)
class UpRecord:
    pid: int
    socket: Path
    bind: str


def record_path(env: Mapping[str, str] = os.environ) -> Path:
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / NAME
    if os.geteuid() == 0:
        return Path("/run") / NAME
    return Path(f"/tmp/ktd-up-{os.getuid()}.json")


def write(path: Path, record: UpRecord) -> bool:
    """Write the record (0600, whole or not at all); False if it cannot be written (a
    ``ktd up`` runs on without it: ktctl then does not find it by itself)."""
    doc = {"pid": record.pid, "socket": str(record.socket), "bind": record.bind}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def remove(path: Path, pid: int) -> None:
    """Remove the record if it is still ``pid``'s (another ``ktd up`` may have written
    its own since)."""
    got = _load(path)
    if got is not None and got.pid == pid:
        try:
            os.unlink(path)
        except OSError:
            pass


def read(path: Path) -> UpRecord | None:
    """The record of a ``ktd up`` that runs, or None (none, stale, or not to be trusted)."""
    got = _load(path)
    if got is None or not _alive(got.pid):
        return None
    try:
        if not stat.S_ISSOCK(os.stat(got.socket).st_mode):
            return None
    except OSError:
        return None
    return got


def _load(path: Path) -> UpRecord | None:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    pid, sock, bind = doc.get("pid"), doc.get("socket"), doc.get("bind", "")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not isinstance(sock, str) or not sock or not isinstance(bind, str):
        return None
    return UpRecord(pid=pid, socket=Path(sock), bind=bind)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
