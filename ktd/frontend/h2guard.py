"""Keep one HTTP/2 connection's close race from taking the whole frontend down.

sglang-router probes every worker it registers over HTTP *and* gRPC at once
(``detect_connection``): the gRPC probe is an HTTP/2 prior-knowledge connection
(``PRI * HTTP/2.0``) that Hypercorn accepts. When the router drops it, Hypercorn
0.18's trio server can run ``send_eof`` (closing) while the HTTP/2 send task
still writes; trio raises ``BusyResourceError`` from ``send_all``, Hypercorn does
not catch it, and the error escapes the connection's task group into the
listener's nursery: the frontend process exits. Treating that error like the
broken pipe it stands for (the peer is gone) keeps it to the one connection.
"""

from __future__ import annotations

from typing import Any

import trio


def install() -> None:
    """Patch Hypercorn's trio ``TCPServer.protocol_send`` (idempotent)."""
    from hypercorn.events import Closed
    from hypercorn.trio import tcp_server

    cls: Any = tcp_server.TCPServer
    if getattr(cls, "_ktd_h2guard", False):
        return
    original = cls.protocol_send

    async def protocol_send(self: Any, event: Any) -> None:
        try:
            await original(self, event)
        except trio.BusyResourceError:
            await self.protocol.handle(Closed())

    cls.protocol_send = protocol_send
    cls._ktd_h2guard = True
