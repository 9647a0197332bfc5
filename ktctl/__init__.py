"""ktctl: the command line of ktd, and ``ktctl.Client``, its Python API for local tools.

``from ktctl import Client`` gives a synchronous client of ktd's control socket
(see ``Client``'s docstring for an example). Importing ktctl is cheap on
purpose: zmq, msgspec and ``ktd.protocol``, never trio, quart or httpx.
"""

from ktctl.client import (
    Client,
    ConnectionLost,
    DaemonUnreachable,
    KtctlError,
    KtdError,
    ProtocolError,
    Subscription,
)

__all__ = [
    "Client",
    "ConnectionLost",
    "DaemonUnreachable",
    "KtctlError",
    "KtdError",
    "ProtocolError",
    "Subscription",
]
