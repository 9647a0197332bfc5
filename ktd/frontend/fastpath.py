"""The proxied routes as a raw ASGI layer in front of Quart.

``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` are
answered here, straight on ASGI messages; everything else (``/v1/models``,
``/health``, ``/metrics``, unknown routes, wrong methods) goes on to the Quart
app. Why: Quart's per-request machinery (request and app contexts, the
response object, its body iterator with a timeout per chunk, signals) cost
more than the proxying itself, and a streamed answer paid for Quart on every
chunk. The route logic did not change; see app.py for the request flow.

Request flow:

1. API key, then the body (size-limited), then ``model``/``stream`` only.
2. ``Acquire`` through the lease broker (the daemon loads on demand).
3. Non-streaming: wait for the lease, send the original bytes upstream, answer
   with the engine's status and body.
   Streaming: wait for the lease for at most ``stream_grace`` seconds. Decided in
   time (the usual case: the engine is up, or the name is unknown) -> the
   client gets the real status: 404 for an unknown model, the engine's own
   error status, or the engine's 200 stream. Not decided (a load is running) ->
   answer 200 at once and keep the client company with ``: loading`` comments;
   from then on failures are in-band error events.

Client disconnects: once the body is read, one task per request waits on
``receive()``; ``http.disconnect`` cancels the request (as quart-trio does),
and the ``finally`` closes the upstream connection and releases the lease.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import trio

from ktd.aclient import ControlError, Unreachable
from ktd.frontend import errors
from ktd.frontend.body import check_declared_length, parse_head, read_limited
from ktd.frontend.errors import ApiError
from ktd.frontend.metrics import NO_MODEL
from ktd.frontend.proxy import (
    SSE_CONTENT_TYPE,
    STREAM_HEADERS,
    Exchange,
    backward_headers,
    control_error,
    forward_headers,
    relay,
    stream_headers,
)
from ktd.frontend.upstream import UpstreamError

if TYPE_CHECKING:
    from ktd.frontend.app import State

log = logging.getLogger("ktd.frontend")

PROXIED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON = (b"content-type", b"application/json")


class _Disconnected(Exception):
    """The client went away while we read its body."""


async def send_error(send: Send, err: ApiError) -> None:
    """An OpenAI-shaped error response, as app.error_response renders it in Quart."""
    body = err.body()
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return None


async def _body_chunks(first: bytes, receive: Receive) -> Any:
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _read_body(receive: Receive, limit: int) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _Disconnected
    first: bytes = message.get("body", b"")
    if not message.get("more_body", False) and (not limit or len(first) <= limit):
        return first  # the usual case: the whole body in one message
    return await read_limited(_body_chunks(first, receive), limit)


class _Watch:
    """Cancels the request when the client goes away, but not after the answer ended.

    Hypercorn queues an ``http.disconnect`` for every request when its response
    is complete, from inside our last ``send``: cancelling then would interrupt
    Hypercorn's own connection bookkeeping (keep-alive timer) halfway.
    """

    __slots__ = ("finished", "send")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.finished = False

    async def tracked_send(self, message: Any) -> None:
        if not message.get("more_body", False) and message["type"] == "http.response.body":
            self.finished = True
        await self.send(message)

    async def run(self, receive: Receive, scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.finished:
                    scope.cancel()
                return


class ProxyRoutes:
    """ASGI middleware: the proxied routes here, the rest to ``app``."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = PROXIED.get(scope["path"])
            if endpoint is not None:
                await self.proxy(endpoint, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def proxy(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        options = state.options
        started = trio.current_time()
        try:
            state.keys.check(_header(scope, b"authorization"))
            limit = options.frontend.max_body_bytes
            declared = _header(scope, b"content-length")
            if declared is not None:
                try:
                    check_declared_length(int(declared), limit)
                except ValueError:
                    pass  # Hypercorn (h11) refuses a malformed length before we get here
            with trio.move_on_after(options.body_timeout) as timer:
                body = await _read_body(receive, limit)
            if timer.cancelled_caught:
                raise ApiError(408, "Timed out reading the request body.", code="body_timeout")
            head = parse_head(body)
        except ApiError as err:
            state.metrics.requests.labels(endpoint, NO_MODEL, str(err.status)).inc()
            await send_error(send, err)
            return
        except _Disconnected:
            state.metrics.requests.labels(endpoint, NO_MODEL, "499").inc()
            return

        query: bytes = scope.get("query_string") or b""
        target: bytes = scope.get("raw_path") or scope["path"].encode()
        ex = Exchange(
            broker=state.broker,
            pool=state.upstream,
            metrics=state.metrics,
            endpoint=endpoint,
            model=head.model,
            target=target + b"?" + query if query else target,
            body=body,
            headers=forward_headers(scope["headers"]),
            started=started,
        )
        try:
            watch = _Watch(send)
            send = watch.tracked_send
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run, receive, nursery.cancel_scope)
                try:
                    await self._exchange(ex, head.stream, send)
                except ApiError as err:
                    ex.failed(err)
                    await send_error(send, err)
                except Exception:
                    log.exception("unexpected error on POST %s", scope["path"])
                    internal = ApiError(
                        500, "internal frontend error", type=errors.SERVER_ERROR, code="internal"
                    )
                    ex.failed(internal)
                    await _try_send_error(send, internal)
                nursery.cancel_scope.cancel()
        finally:
            ex.close()

    async def _exchange(self, ex: Exchange, stream: bool, send: Send) -> None:
        state = self.state
        options = state.options
        try:
            ex.handle = await state.broker.start_acquire(
                ex.model,
                autoload=options.frontend.autoload,
                load_timeout=options.frontend.load_timeout,
            )
            lease = await ex.handle.wait(options.stream_grace if stream else math.inf)
        except (ControlError, Unreachable) as exc:
            raise ex.failed(control_error(ex.model, exc)) from None
        if lease is None:
            # Still loading: answer 200 now, and wait inside the body.
            headers = [SSE_CONTENT_TYPE, *STREAM_HEADERS]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await relay(ex, send, interval=options.loading_interval)
            return
        ex.got_lease(lease, trio.current_time() - ex.started)
        upstream = await ex.open_upstream()
        if stream and upstream.status == 200:
            headers = stream_headers(upstream.headers)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await relay(ex, send, interval=options.loading_interval)
            return
        try:
            data = await upstream.read()
        except UpstreamError as exc:
            raise ex.upstream_error(exc) from None
        ex.status = upstream.status
        ex.first_byte()
        headers = backward_headers(upstream.headers)
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})


async def _try_send_error(send: Send, err: ApiError) -> None:
    """A 500 if nothing was sent yet; Hypercorn ignores it (or closes) otherwise."""
    try:
        await send_error(send, err)
    except Exception:
        pass
