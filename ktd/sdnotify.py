"""systemd's notify protocol without a dependency: one datagram to ``$NOTIFY_SOCKET``."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(message: str, env: Mapping[str, str] = os.environ) -> bool:
    path = env.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Half of WATCHDOG_USEC (systemd's advice), when the watchdog is meant for this process."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
