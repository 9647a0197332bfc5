"""Hypercorn's trio transport, patched where the frontend measured it or broke on it.

Both patches wrap ``hypercorn.trio.tcp_server.TCPServer.protocol_send``, the one
place Hypercorn writes to a client socket.

* **Writes that fit go out at once.** Hypercorn sends every piece of a response
  (the head, each body chunk, the chunked terminator) through trio's
  ``SocketStream.send_all``, which takes a lock, opens a shielded cancel scope and
  yields to the scheduler after the write even when the kernel took every byte.
  On the proxy's hot path that yield is a full scheduler pass per SSE chunk and
  three per request, more than the write itself (bench/RESULTS.md, issue 15). So
  when nothing else is writing on the connection (the lock is free), the bytes go
  to the socket with one non-blocking ``send``; only what the kernel does not take
  now (a slow client) goes the usual way, under the lock, waiting for the socket.
  Nothing can interleave: there is no ``await`` between the check and the write.
  TLS streams are left alone.
* **One HTTP/2 connection's close race must not take the frontend down.**
  sglang-router probes every worker it registers over HTTP *and* gRPC at once
  (``detect_connection``): the gRPC probe is an HTTP/2 prior-knowledge
  connection (``PRI * HTTP/2.0``) that Hypercorn accepts. When the router drops
  it, Hypercorn 0.18's trio server can run ``send_eof`` (closing) while the
  HTTP/2 send task still writes; trio raises ``BusyResourceError`` from
  ``send_all``, Hypercorn does not catch it, and the error escapes the
  connection's task group into the listener's nursery: the frontend process
  exits. Treating that error like the broken pipe it stands for (the peer is
  gone) keeps it to the one connection.
"""

from __future__ import annotations

import os
from typing import Any

import trio


def install() -> None:
    """Patch Hypercorn's trio ``TCPServer.protocol_send`` (idempotent)."""
    from hypercorn.events import Closed, RawData
    from hypercorn.trio import tcp_server

    cls: Any = tcp_server.TCPServer
    if getattr(cls, "_ktd_transport", False):
        return
    original = cls.protocol_send

    async def protocol_send(self: Any, event: Any) -> None:
        if type(event) is RawData and not self.send_lock.locked():
            stream = self.stream
            if type(stream) is trio.SocketStream:
                data = event.data
                try:
                    sent = os.write(stream.socket.fileno(), data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    sent = -1  # broken or closed: the usual path reports it properly
                if sent == len(data):
                    return
                if sent > 0:
                    event = RawData(data=data[sent:])
        try:
            await original(self, event)
        except trio.BusyResourceError:
            await self.protocol.handle(Closed())

    cls.protocol_send = protocol_send
    cls._ktd_transport = True
