"""What both control clients (ktctl's sync one, the frontend's trio one) must agree on.

The control socket's path, the DEALER's options and what an ``Error`` reply means
are one contract with the daemon; written once here, a fix to one of them reaches
both clients. Light on purpose: zmq, ``ktd.paths``, ``ktd.protocol`` and
``ktd.control.errors`` only, because ktctl imports it and must start fast (no trio).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import zmq

from ktd import paths
from ktd import protocol as p
from ktd.control.errors import ControlError

__all__ = ["DEALER_OPTIONS", "check_reply", "control_path", "dealer"]

E = TypeVar("E", bound=ControlError)

#: LINGER 0: a closed client never blocks its process on unsent requests.
#: IMMEDIATE: a request is queued only on a completed connection, so "not
#: writable" means "no daemon handshake yet" (ktctl bounds that phase).
#: RECONNECT_IVL(_MAX): a restarted daemon is found again within a second.
#: RCVHWM 0: replies are never dropped on the client's side (a burst of them
#: past the default 1,000 would be, unread).
DEALER_OPTIONS: tuple[tuple[int, int], ...] = (
    (zmq.LINGER, 0),
    (zmq.IMMEDIATE, 1),
    (zmq.RECONNECT_IVL, 100),
    (zmq.RECONNECT_IVL_MAX, 1000),
    (zmq.RCVHWM, 0),
)


def control_path(socket: str | Path | None = None, env: Mapping[str, str] = os.environ) -> Path:
    """The control socket path: the argument, else ``$KTD_SOCKET``, else the runtime dir.

    An ``ipc://`` prefix is accepted because that is how the path appears in
    ktd's own messages and in zmq endpoints people copy around.
    """
    if socket is None:
        return paths.control_path(env)
    return Path(str(socket).removeprefix("ipc://"))


def dealer(ctx: zmq.Context[Any]) -> zmq.Socket[bytes]:
    """A new, unconnected DEALER with the options every control client uses."""
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    for option, value in DEALER_OPTIONS:
        sock.setsockopt(option, value)
    return sock


def check_reply(reply: p.Reply, error: type[E]) -> p.Reply:
    """``reply`` itself, unless it is an ``Error`` reply: then ``error`` raised from it
    (each client raises its own subclass of ``ControlError``)."""
    if isinstance(reply, p.Error):
        raise error.from_reply(reply)
    return reply
