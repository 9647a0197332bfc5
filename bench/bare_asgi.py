"""The floor: a bare ASGI app that answers a streamed chat completion by itself.

Served by ``hypercorn -k trio bench.bare_asgi:app`` (Hypercorn's own trio
worker, as ``ktd frontend`` uses it), it is what any app inside Hypercorn costs
before it does anything of its own: it reads the body, takes ``max_tokens`` out
of it, and answers 200 with SSE events shaped like the sim's (a role chunk, one
chunk per token, a finish chunk, ``data: [DONE]``), one ASGI ``send`` each, as
the sim writes one HTTP chunk each. No upstream, no routing, no admission, no
metrics. bench/proxy_stream.py measures its time to first byte and CPU per
request with the same client as the proxies.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]

_HEAD = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_PREFIX = b'data: {"id":"chatcmpl-bare","object":"chat.completion.chunk","created":0,"model":"bench","choices":[{"index":0,"delta":'  # noqa: E501
_ROLE = _PREFIX + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
_TOKEN = _PREFIX + b'{"content":"tok "},"finish_reason":null}]}\n\n'
_FINISH = _PREFIX + b'{},"finish_reason":"length"}]}\n\n'
_DONE = b"data: [DONE]\n\n"


async def app(
    scope: Scope,
    receive: Callable[[], Awaitable[Any]],
    send: Callable[[Any], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    body = await _body(receive)
    try:
        tokens = int(json.loads(body).get("max_tokens", 16))
    except (ValueError, AttributeError):
        tokens = 16
    await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
    await send({"type": "http.response.body", "body": _ROLE, "more_body": True})
    for _ in range(tokens):
        await send({"type": "http.response.body", "body": _TOKEN, "more_body": True})
    await send({"type": "http.response.body", "body": _FINISH, "more_body": True})
    await send({"type": "http.response.body", "body": _DONE, "more_body": False})


async def _body(receive: Callable[[], Awaitable[Any]]) -> bytes:
    body: bytes = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


# ---------------------------------------------------------------- the proxy floor

_UPSTREAM = os.environ.get("BARE_UPSTREAM", "")
_REQUEST_HEADERS = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
_pool: Any = None


async def proxy(
    scope: Scope,
    receive: Callable[[], Awaitable[Any]],
    send: Callable[[Any], Awaitable[None]],
) -> None:
    """The least a proxy inside Hypercorn can do: ``hypercorn -k trio bare_asgi:proxy``.

    Forwards the body to ``BARE_UPSTREAM`` on the frontend's own keep-alive
    client (ktd.frontend.upstream) and relays the stream, under ktd's Hypercorn
    patches (transport.py, intake.py), with nothing of ktd's own request work:
    no key, routing, admission, headers or metrics. What ``ktd frontend`` adds
    over this is the cost of being ktd.
    """
    global _pool
    if scope["type"] != "http":
        await app(scope, receive, send)
        return
    if _pool is None:
        from ktd.frontend.upstream import UpstreamPool

        _pool = UpstreamPool(read_timeout=60)
    body = await _body(receive)
    resp = await _pool.request(_UPSTREAM, scope["path"].encode(), _REQUEST_HEADERS, body)
    try:
        await send({"type": "http.response.start", "status": resp.status, "headers": _HEAD})
        data = b""
        while not resp.done:
            data = await resp.receive()
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": not resp.done})
        if not data:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        resp.close()


_idle: list[Any] = []  # raw_proxy's upstream sockets, none in use


async def raw_proxy(
    scope: Scope,
    receive: Callable[[], Awaitable[Any]],
    send: Callable[[Any], Awaitable[None]],
) -> None:
    """``proxy`` without ktd's upstream client: ``hypercorn -k trio bare_asgi:raw_proxy``.

    The same relay under the same patches, but the engine is reached on bare
    non-blocking sockets (a list of idle ones, checked as ktd checks them; no
    timeouts, no pool bookkeeping), its response decoded by ktd's sans-IO parser. What
    ``proxy`` adds over this is the upstream client's own cost; what this adds
    over bench/raw_relay.py is Hypercorn's.
    """
    if scope["type"] != "http":
        await app(scope, receive, send)
        return
    import socket

    import trio

    from ktd.frontend.h1 import END, NEED_DATA, Head, ResponseParser, build_request

    netloc = _UPSTREAM.split("//", 1)[1]
    body = await _body(receive)
    request = build_request(
        b"POST", scope["path"].encode(), netloc.encode(), _REQUEST_HEADERS, len(body)
    )
    sock = None
    while _idle and sock is None:
        sock = _idle.pop()
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            break  # nothing to read: still open
        except OSError:
            pass
        sock.close()  # EOF (the engine closed it while idle) or a stray byte
        sock = None
    if sock is None:
        host, port = netloc.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fd = sock.fileno()
    os.write(fd, request + body)
    parser = ResponseParser(b"POST")
    while True:
        event = parser.next_event()
        if event is NEED_DATA:
            try:
                parser.feed(os.read(fd, 65536))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
        elif isinstance(event, Head):
            await send({"type": "http.response.start", "status": event.status, "headers": _HEAD})
        elif isinstance(event, bytes):
            done = parser.complete
            await send({"type": "http.response.body", "body": event, "more_body": not done})
            if done:
                break
        elif event is END:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            break
    _idle.append(sock)


def _patch() -> None:
    if _UPSTREAM:
        from ktd.frontend import intake, transport

        transport.install()
        intake.install()


_patch()
