"""Whether a TCP port can be bound, and a free one: socket facts, no process involved.

Outside ``ktd/daemon/`` (issue 45) because doctor checks the ports in ktctl's own
process when the daemon is down; ``ktd.daemon.engine.proctree`` re-exports both.
"""

from __future__ import annotations

import socket


def port_free(host: str, port: int) -> bool:
    """Can the port be bound again? (SO_REUSEADDR, as SGLang's uvicorn binds.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
