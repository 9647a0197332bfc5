"""What every route of the frontend needs from a request, in one place: a header, a
bounded body read in time, and an error sent in the route's own shape (the key a request
shows is read by ``ktd.core.keys.bearer``, for the API and the dashboard alike).

Why one module: the proxy (``flow.py``), Ollama's routes (``ollama.py``), the dashboard
(``ui/asgi.py``) and the guard in front of them all (``origin.py``) each read headers and
bodies and answer errors; written once here, a limit or a rule (when a connection must
close) is the same on every route. Plain ASGI, no framework: the hot proxy path goes
through it too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import trio

from ktd.frontend import errors
from ktd.frontend.body import read_limited
from ktd.frontend.errors import ApiError

__all__ = [
    "DRAIN_BYTES",
    "DRAIN_SECONDS",
    "JSON_HEADER",
    "ASGIApp",
    "Disconnected",
    "Receive",
    "Scope",
    "Send",
    "drain",
    "drained",
    "header",
    "headers",
    "may_have_body",
    "read_body",
    "read_body_in_time",
    "respond",
    "send_error",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# How much of an unread body the frontend swallows before an early error (401,
# 404...) so the connection stays usable; past it the answer closes the connection.
DRAIN_BYTES = 1 << 20
DRAIN_SECONDS = 2.0

JSON_HEADER = (b"content-type", b"application/json")


class Disconnected(Exception):
    """The client went away while we read its body."""


def headers(scope: Mapping[str, Any], name: bytes) -> list[bytes]:
    """Every value of the header ``name`` (lowercase), in order."""
    return [bytes(v) for k, v in scope["headers"] if k.lower() == name]


def header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    """The first value of the header ``name`` (lowercase), or None."""
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return None


def may_have_body(scope: Scope) -> bool:
    """A request with a Content-Length > 0 or chunked framing carries a body."""
    for key, value in scope["headers"]:
        name = key.lower()
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
    return False


async def read_body_in_time(receive: Receive, limit: int, seconds: float) -> bytes:
    """The whole body, within ``limit`` bytes (413; 0: none) and ``seconds`` (408)."""
    with trio.move_on_after(seconds):
        return await read_body(receive, limit)
    raise errors.make("body_timeout")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body within ``limit`` bytes (413; 0: none); ``Disconnected`` if the
    client goes away first."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise Disconnected
    first: bytes = message.get("body", b"")
    if not message.get("more_body", False) and (not limit or len(first) <= limit):
        return first  # the usual case: the whole body in one message
    return await read_limited(_body_chunks(first, receive), limit)


async def _body_chunks(first: bytes, receive: Receive) -> AsyncIterator[bytes]:
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def drained(scope: Scope, receive: Receive) -> bool:
    """Whether the request's body is read to its end once what is left of it (within
    ``DRAIN_BYTES`` and ``DRAIN_SECONDS``) is dropped: before an early answer, so the
    connection can carry the client's next request; False: answer with
    ``Connection: close``."""
    return not may_have_body(scope) or await drain(receive)


async def drain(
    receive: Receive, max_bytes: int = DRAIN_BYTES, seconds: float = DRAIN_SECONDS
) -> bool:
    """Read and drop the rest of a request body; True when it ended within the bounds."""
    size = 0
    with trio.move_on_after(seconds):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            size += len(message.get("body", b""))
            if size > max_bytes:
                return False
            if not message.get("more_body", False):
                return True
    return False


async def send_error(
    send: Send,
    err: ApiError,
    *,
    close: bool = False,
    ollama: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An error in the route's shape: OpenAI's, or Ollama's (``ollama``: its ``/api/...``
    routes).

    ``close``: the request body was not read to its end, so the connection cannot carry
    another request: say so (``Connection: close``). ``extra``: more headers.
    """
    body = err.ollama_body() if ollama else err.body()
    more = dict(err.headers)
    if close:
        more["Connection"] = "close"
    out = [
        JSON_HEADER,
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in more.items()),
    ]
    await respond(send, err.status, body, out + (extra or []))


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole answer at once: ``headers`` (its content type among them) and the body
    with its ``content-length``."""
    out = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})
