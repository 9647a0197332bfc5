"""Which ktd ``ktctl`` talks to when it is not told (issue 43).

Told (``--socket``, ``$KTD_SOCKET`` or ``$KTD_RUNTIME_DIR``): that socket, always.
Otherwise the default path (``ktd.paths``) when a socket is there; else a running
``ktd up``, from the record it keeps (``ktd/uprecord.py``: ``ktd up --demo`` serves on
a socket of its own temporary directory, and a new user's ``ktctl status`` said
"ktd is not running" beside it), said on stderr since it is not the default; else, for
a user other than root, the system's ktd at ``/run/ktd/control.sock`` (systemd's unit;
its group may use it); else the default path, whose "not running" error names it.

``ktctl.Client()`` itself keeps the plain rule (argument, environment, runtime dir):
a library must not pick a daemon by guessing.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ktd import paths, uprecord
from ktd.control.endpoint import control_path

#: Where systemd's ktd (``systemd/ktd.service``) serves.
SYSTEM_SOCKET = Path("/run/ktd/control.sock")


@dataclass(frozen=True)
class SocketChoice:
    path: Path
    note: str | None = None  # said on stderr: the socket is not the one asked for


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def control_socket(
    given: str | None, env: Mapping[str, str] = os.environ, *, root: bool | None = None
) -> SocketChoice:
    """The control socket ktctl uses (the rules in the module's docstring)."""
    if given is not None or env.get("KTD_SOCKET") or env.get("KTD_RUNTIME_DIR"):
        return SocketChoice(control_path(given, env))
    default = paths.control_path(env)
    if _is_socket(default):
        return SocketChoice(default)
    up = uprecord.read(uprecord.record_path(env))
    if up is not None:
        note = f"ktctl: no ktd at {default}; using the `ktd up` (pid {up.pid}) at {up.socket}"
        return SocketChoice(up.socket, note)
    root = os.geteuid() == 0 if root is None else root
    if not root and default != SYSTEM_SOCKET and _is_socket(SYSTEM_SOCKET):
        return SocketChoice(SYSTEM_SOCKET)
    return SocketChoice(default)


def socket_for(given: str | None, *, quiet: bool) -> Path:
    """``control_socket`` for the CLI: its note on stderr unless ``quiet`` (--json)."""
    found = control_socket(given)
    if found.note and not quiet:
        print(found.note, file=sys.stderr, flush=True)
    return found.path
