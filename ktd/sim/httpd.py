"""A small HTTP/1.1 server on trio + h11: keep-alive, Content-Length, chunked SSE.

Why not a web framework: the sim is the engine of ktd's benchmarks (64 x 64
streamed chunks, 1,000 concurrent slow streams) and of every test that starts
an engine, so it must start fast and cost little per chunk. h11 does the
protocol, trio the sockets; this module only maps one request to one reply.

Like uvicorn (which SGLang runs), it closes idle keep-alive connections after
5 s, sends ``date``/``server: uvicorn`` headers, logs one access line per
response, and notices a client that goes away mid-request: for POSTs a
watcher task reads the socket while the reply is produced, and EOF cancels the
handler or the stream at once instead of at the next failed write.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
import trio

from ktd.sim.logfmt import uvicorn

RECV_SIZE = 65536
MAX_BODY = 64 * 1024 * 1024
KEEPALIVE = 5.0  # uvicorn's timeout_keep_alive as SGLang sets it
MAX_PIPELINED = 1024 * 1024  # bytes buffered from a client while we stream to it

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"


@dataclass
class HttpRequest:
    method: str
    target: str  # path + query, as sent
    path: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    client: str  # "host:port"
    http_version: str
    disconnected: bool = False  # set when the client went away before the reply ended


@dataclass
class HttpReply:
    status: int = 200
    body: bytes = b""
    content_type: str | None = JSON
    # An SSE body: each item is sent as one HTTP chunk, as soon as it is yielded.
    stream: AsyncGenerator[bytes, None] | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    # Called exactly once when the exchange ends: True when it was cut short.
    finish: Callable[[bool], None] | None = None
    # Called after each stream chunk has been handed to the socket.
    on_chunk: Callable[[], None] | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpReply]]

_date: tuple[int, str] = (0, "")
_phrases: dict[int, str] = {}


def http_date() -> str:
    global _date
    now = int(time.time())
    if now != _date[0]:
        _date = (now, time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now)))
    return _date[1]


def phrase(status: int) -> str:
    text = _phrases.get(status)
    if text is None:
        try:
            text = HTTPStatus(status).phrase
        except ValueError:
            text = ""
        _phrases[status] = text
    return text


class _TooLarge(Exception):
    pass


def _is_disconnect(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError))


class HttpServer:
    """``await server.serve(stream)`` for each accepted connection."""

    def __init__(self, handler: Handler, *, access_log: bool = True) -> None:
        self.handler = handler
        self.access_log = access_log
        self.keepalive = KEEPALIVE

    async def serve(self, stream: trio.SocketStream) -> None:
        await _Connection(self, stream).run()


def _peer(stream: trio.SocketStream) -> str:
    try:
        addr = stream.socket.getpeername()
    except OSError:
        return "-"
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class _Connection:
    def __init__(self, server: HttpServer, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.h = h11.Connection(h11.SERVER)
        self.client = _peer(stream)
        self.gone = False

    async def run(self) -> None:
        try:
            while not self.gone:
                event: h11.Event | type[h11.PAUSED] | None = None
                with trio.move_on_after(self.server.keepalive):
                    event = await self._next_event()
                if not isinstance(event, h11.Request):
                    return  # idle timeout, EOF or ConnectionClosed
                request = await self._read_request(event)
                if request is None:
                    return
                await self._exchange(request)
                if self.h.our_state is not h11.DONE or self.h.their_state is not h11.DONE:
                    return
                self.h.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            uvicorn("WARNING", "Invalid HTTP request received.")
            await self._send_error(exc.error_status_hint, b"Invalid HTTP request received.")
        except _TooLarge:
            await self._send_error(413, b"Request Entity Too Large")
        except Exception as exc:
            # One broken connection must never take the server down (trio would
            # propagate it through serve_listeners); a client that went away is normal.
            if not _is_disconnect(exc):
                uvicorn("ERROR", "Exception in connection handler\n" + traceback.format_exc())

    # -- reading
    async def _receive(self) -> bytes:
        try:
            return await self.stream.receive_some(RECV_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.h.next_event()
            if event is h11.PAUSED or isinstance(event, h11.Event):
                return event
            if self.h.they_are_waiting_for_100_continue:
                await self._send(h11.InformationalResponse(status_code=100, headers=[]))
            self.h.receive_data(await self._receive())

    async def _read_request(self, event: h11.Request) -> HttpRequest | None:
        parts: list[bytes] = []
        size = 0
        while True:
            ev = await self._next_event()
            if isinstance(ev, h11.Data):
                size += len(ev.data)
                if size > MAX_BODY:
                    raise _TooLarge
                parts.append(bytes(ev.data))
            elif isinstance(ev, h11.EndOfMessage):
                break
            else:
                return None
        target = event.target.decode("latin-1")
        return HttpRequest(
            method=event.method.decode("ascii"),
            target=target,
            path=target.split("?", 1)[0],
            headers={k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers},
            body=b"".join(parts),
            client=self.client,
            http_version=event.http_version.decode("ascii"),
        )

    # -- writing
    async def _send(self, event: h11.Event) -> None:
        data = self.h.send(event)
        if data:
            await self.stream.send_all(data)

    def _head(self, request: HttpRequest, reply: HttpReply, length: int | None) -> h11.Response:
        headers: list[tuple[str, str]] = [("date", http_date()), ("server", "uvicorn")]
        if length is not None:
            headers.append(("content-length", str(length)))
        if reply.content_type:
            headers.append(("content-type", reply.content_type))
        headers.extend(reply.headers)
        if self.server.access_log:
            uvicorn(
                "INFO",
                f'{request.client} - "{request.method} {request.target} '
                f'HTTP/{request.http_version}" {reply.status} {phrase(reply.status)}',
            )
        return h11.Response(status_code=reply.status, headers=headers, reason=phrase(reply.status))

    async def _send_error(self, status: int, body: bytes) -> None:
        if self.h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            headers = [
                ("date", http_date()),
                ("server", "uvicorn"),
                ("content-length", str(len(body))),
                ("content-type", "text/plain; charset=utf-8"),
                ("connection", "close"),
            ]
            head = h11.Response(status_code=status, headers=headers, reason=phrase(status))
            data = self.h.send(head)
            data = (data or b"") + (self.h.send(h11.Data(data=body)) or b"")
            data += self.h.send(h11.EndOfMessage()) or b""
            await self.stream.send_all(data)
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    # -- one request/response exchange
    async def _exchange(self, request: HttpRequest) -> None:
        if request.method != "POST":
            await self._respond(request)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_peer, nursery.cancel_scope, request)
            await self._respond(request)
            nursery.cancel_scope.cancel()

    async def _watch_peer(self, scope: trio.CancelScope, request: HttpRequest) -> None:
        """EOF from the client while we answer = it went away: cancel the answer."""
        buffered = 0
        while buffered < MAX_PIPELINED:
            data = await self._receive()
            if not data:
                self.gone = True
                request.disconnected = True
                scope.cancel()
                return
            buffered += len(data)
            self.h.receive_data(data)  # a pipelined next request: h11 keeps it

    async def _respond(self, request: HttpRequest) -> None:
        reply: HttpReply | None = None
        aborted = True
        try:
            try:
                reply = await self.server.handler(request)
            except Exception:
                uvicorn("ERROR", "Exception in ASGI application\n" + traceback.format_exc())
                reply = HttpReply(500, b"Internal Server Error", "text/plain; charset=utf-8")
            if reply.stream is None:
                data = self.h.send(self._head(request, reply, len(reply.body))) or b""
                if reply.body and request.method != "HEAD":  # HEAD: the length, no body
                    data += self.h.send(h11.Data(data=reply.body)) or b""
                data += self.h.send(h11.EndOfMessage()) or b""
                await self.stream.send_all(data)
            else:
                await self._send(self._head(request, reply, None))
                on_chunk = reply.on_chunk
                try:
                    async for chunk in reply.stream:
                        await self._send(h11.Data(data=chunk))
                        if on_chunk is not None:
                            on_chunk()
                except Exception as exc:
                    if _is_disconnect(exc):
                        raise
                    # As uvicorn: the app failed after its status went out; the body is
                    # cut (no last chunk) and the connection closed. Not a client abort.
                    uvicorn("ERROR", "Exception in ASGI application\n" + traceback.format_exc())
                    self.gone = True
                    aborted = False
                    return
                # Every event is out: a client that hangs up now (after ``[DONE]``, before
                # the last zero-length chunk) got the whole answer.
                aborted = False
                await self._send(h11.EndOfMessage())
            aborted = False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
            request.disconnected = True
        finally:
            if reply is not None:
                if reply.stream is not None:
                    with trio.CancelScope(shield=True):
                        await reply.stream.aclose()
                if reply.finish is not None:
                    reply.finish(aborted)
