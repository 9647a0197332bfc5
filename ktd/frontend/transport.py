"""Hypercorn's trio transport, patched where the frontend measured it or broke on it.

The first and the last wrap ``hypercorn.trio.tcp_server.TCPServer.protocol_send``,
the one place Hypercorn writes to a client socket.

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
* **A streamed body's chunks skip h11 (``HTTPStream.app_send``).** Each SSE chunk
  went through Hypercorn's body checks, a ``Body`` event, the protocol's dispatch,
  an ``h11.Data`` event and h11's state machine, only for h11's chunked writer to
  frame it as ``<size hex>\r\n<data>\r\n``. On a box where the client, the engine
  and the frontend share the cores, that CPU per chunk is time the others wait
  (bench/RESULTS.md, issue 22). So a ``more_body`` chunk of an HTTP/1.1 response
  is framed here and written at once, exactly when h11 would have framed it so:
  the stream is past its head (``RESPONSE``), the connection is h11's, in
  ``SEND_BODY``, with a chunked writer. Everything else (the head, a
  Content-Length or HTTP/1.0 body, HEAD, the last chunk, trailers, HTTP/2) goes
  Hypercorn's way, and the bytes on the wire are the same either way. h11 keeps
  no state per data chunk of a chunked body, so skipping its events leaves it
  where it would be.
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

import logging
import math
import os
from typing import Any

import trio

log = logging.getLogger("ktd.frontend")


class ClientDeaf(Exception):
    """A write to the client waited longer than ``frontend.send_timeout``: the client
    stopped reading. The connection is closed; the caller (the stream's relay) ends
    its exchange, which frees the slot and aborts the engine's request."""


_send_timeout = [math.inf]  # seconds one write may wait for the client (set by install)


def install(send_timeout: float = math.inf) -> None:
    """Patch Hypercorn's trio ``TCPServer.protocol_send`` (idempotent; the last
    ``send_timeout`` given applies).

    **A client that stops reading is let go.** Hypercorn writes under a shielded
    cancel scope with no bound: a client that never reads holds its stream, and the
    engine slot behind it, for ever. A write the kernel does not take at once waits
    for the socket at most ``send_timeout`` (nginx's ``send_timeout``), still shielded
    from outside cancellation; past it the connection is closed and ``ClientDeaf``
    raised to the ASGI ``send`` that wrote."""
    _send_timeout[0] = send_timeout
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
        if type(event) is RawData and _send_timeout[0] < math.inf:
            await _bounded_send(self, event, original, Closed)
            return
        try:
            await original(self, event)
        except trio.BusyResourceError:
            await self.protocol.handle(Closed())

    cls.protocol_send = protocol_send
    cls._ktd_transport = True
    _install_chunk_path()


async def _bounded_send(server: Any, event: Any, original: Any, closed: Any) -> None:
    """Hypercorn's write (under its lock, shielded), bounded by the send timeout."""
    async with server.send_lock:
        with trio.CancelScope(shield=True), trio.move_on_after(_send_timeout[0]) as bound:
            try:
                await server.stream.send_all(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                await server.protocol.handle(closed())
                return
    if bound.cancelled_caught:
        log.warning(
            "client %s stopped reading for %gs (frontend.send_timeout): connection closed",
            _peer(server),
            _send_timeout[0],
        )
        await original(server, closed())  # close the socket, tell the protocol
        raise ClientDeaf


def _peer(server: Any) -> str:
    try:
        host, port = server.stream.socket.getpeername()[:2]
    except (OSError, AttributeError, ValueError, TypeError):
        return "?"
    return f"{host}:{port}"


def _install_chunk_path() -> None:
    """A streamed body's chunks framed here (see the module docstring)."""
    import h11
    from h11._writers import ChunkedWriter
    from hypercorn.events import RawData
    from hypercorn.protocol.h11 import H11Protocol
    from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream

    stream_cls: Any = HTTPStream
    app_send = stream_cls.app_send
    responding = ASGIHTTPState.RESPONSE
    send_body = h11.SEND_BODY

    async def chunk_send(self: Any, message: Any) -> None:
        if (
            message is not None
            and self.state is responding
            and message["type"] == "http.response.body"
            and message.get("more_body", False)
        ):
            body = message.get("body", b"")
            protocol = getattr(self.send, "__self__", None)
            if body and type(protocol) is H11Protocol:
                conn = protocol.connection
                if conn.our_state is send_body and type(conn._writer) is ChunkedWriter:
                    await protocol.send(RawData(data=b"%x\r\n%b\r\n" % (len(body), body)))
                    return
        await app_send(self, message)

    stream_cls.app_send = chunk_send
