"""The Quart-Trio app: OpenAI routes in front of ktd's engines.

Request flow for the proxied routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings``):

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

The lease is released however the request ends; see proxy.Exchange.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers
from werkzeug.exceptions import HTTPException

from ktd import protocol as p
from ktd.aclient import ControlError, Unreachable
from ktd.config import FrontendSection
from ktd.frontend import errors
from ktd.frontend.auth import ApiKeys
from ktd.frontend.body import check_declared_length, parse_head, read_limited
from ktd.frontend.errors import ApiError
from ktd.frontend.leases import LeaseBroker
from ktd.frontend.metrics import NO_MODEL, Metrics
from ktd.frontend.proxy import (
    STREAM_HEADERS,
    Exchange,
    backward_headers,
    control_error,
    forward_headers,
    make_http_client,
    pool_counts,
    relay,
)

PROXIED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}

_SCOPE_KEY = "ktd.exchange"
_JSON = "application/json"

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


@dataclass
class FrontendOptions:
    """Everything the app needs; main.py fills it from config.json and flags."""

    frontend: FrontendSection
    control_endpoint: str
    heartbeat_interval: float = 5.0  # daemon.lease_ttl / 3
    loading_interval: float = 2.0  # seconds between ``: loading`` comments
    stream_grace: float = 0.5  # how long a stream may wait before committing to 200
    client_id: str | None = None
    body_timeout: float = 60.0


class State:
    """Per-app runtime objects, created at startup inside trio."""

    def __init__(self, options: FrontendOptions) -> None:
        self.options = options
        self.keys = ApiKeys(options.frontend.api_keys)
        self.metrics = Metrics()
        self.broker = LeaseBroker(
            options.control_endpoint,
            client_id=options.client_id,
            heartbeat_interval=options.heartbeat_interval,
        )
        self.http: httpx.AsyncClient | None = None
        self.created = int(time.time())


def _json_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    resp = Response(body, status=status, content_type=_JSON)
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


def error_response(err: ApiError) -> Response:
    return _json_response(err.status, err.body(), err.headers)


class _ExchangeGuard:
    """ASGI middleware: closes a request's exchange when the ASGI call ends.

    Needed for one gap: the route returned a streaming response that owns a
    lease, but the server was cancelled (client gone) before it started
    iterating the body, so the body's own ``finally`` never runs.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            ex = scope.get(_SCOPE_KEY) if scope.get("type") == "http" else None
            if ex is not None and not ex.closed:
                await ex.aclose()


def create_app(options: FrontendOptions) -> QuartTrio:
    """Build the app. Background tasks (control client, heartbeats) start with it."""
    app = QuartTrio("ktd.frontend")
    app.config["MAX_CONTENT_LENGTH"] = None  # counted by read_limited, OpenAI-shaped 413
    app.config["BODY_TIMEOUT"] = options.body_timeout
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    state = State(options)
    app.extensions["ktd"] = state
    app.asgi_app = _ExchangeGuard(app.asgi_app)  # type: ignore[method-assign,assignment,arg-type]

    @app.before_serving
    async def _start() -> None:
        state.http = make_http_client(read_timeout=options.frontend.read_timeout)
        http = state.http
        state.metrics.add_pool_gauge(lambda: pool_counts(http))
        await app.nursery.start(state.broker.run)

    @app.after_serving
    async def _stop() -> None:
        await state.broker.aclose()
        if state.http is not None:
            await state.http.aclose()

    # ------------------------------------------------------------ errors

    @app.errorhandler(ApiError)
    async def _api_error(err: ApiError) -> Response:
        return error_response(err)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 404:
            msg = f"Unknown route: {request.method} {request.path}"
        elif status == 405:
            msg = f"Method {request.method} is not allowed on {request.path}"
        else:
            msg = exc.description or exc.name
        return error_response(ApiError(status, msg, code=exc.name.lower().replace(" ", "_")))

    @app.errorhandler(Exception)
    async def _internal(exc: Exception) -> Response:
        app.logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(
            ApiError(500, "internal frontend error", type=errors.SERVER_ERROR, code="internal")
        )

    # ------------------------------------------------------------ plain routes

    @app.get("/health")
    async def health() -> Response:
        try:
            pong = await state.broker.ping()
        except (Unreachable, ControlError) as exc:
            return error_response(errors.daemon_unreachable(str(exc)))
        body = {"status": "ok", "daemon": {"version": pong.version, "pid": pong.pid}}
        return _json_response(200, errors._encoder.encode(body))

    @app.get("/metrics")
    async def metrics() -> Response:
        data, ctype = state.metrics.render()
        return Response(data, status=200, content_type=ctype)

    @app.get("/v1/models")
    async def models() -> Response:
        state.keys.check(_raw_header(b"authorization"))
        try:
            reply = await state.broker.request(p.Models())
        except (Unreachable, ControlError) as exc:
            raise control_error("", exc) from None
        if not isinstance(reply, p.ModelsReply):
            raise errors.daemon_unreachable(f"unexpected reply {type(reply).__name__}")
        data = [
            {
                "id": m.alias,
                "object": "model",
                "created": state.created,
                "owned_by": "ktd",
                "state": m.state,
            }
            for m in reply.models
            if m.served
        ]
        return _json_response(200, errors._encoder.encode({"object": "list", "data": data}))

    # ------------------------------------------------------------ proxied routes

    async def proxy() -> Response:
        endpoint = PROXIED[request.path]
        started = trio.current_time()
        try:
            state.keys.check(_raw_header(b"authorization"))
            limit = options.frontend.max_body_bytes
            check_declared_length(request.content_length, limit)
            with trio.move_on_after(options.body_timeout) as scope:
                body = await read_limited(request.body, limit)
            if scope.cancelled_caught:
                raise ApiError(408, "Timed out reading the request body.", code="body_timeout")
            head = parse_head(body)
        except ApiError as err:
            state.metrics.requests.labels(endpoint, NO_MODEL, str(err.status)).inc()
            return error_response(err)

        ex = Exchange(
            broker=state.broker,
            http=_http(state),
            metrics=state.metrics,
            endpoint=endpoint,
            model=head.model,
            target=_target(),
            body=body,
            headers=forward_headers(request.scope["headers"]),
            started=started,
        )
        scope_dict: dict[str, Any] = request.scope  # type: ignore[assignment]
        scope_dict[_SCOPE_KEY] = ex
        handed_off = False
        try:
            try:
                ex.handle = await state.broker.start_acquire(
                    head.model,
                    autoload=options.frontend.autoload,
                    load_timeout=options.frontend.load_timeout,
                )
                lease = await ex.handle.wait(options.stream_grace if head.stream else math.inf)
            except (ControlError, Unreachable) as exc:
                raise ex.failed(control_error(head.model, exc)) from None
            if lease is None:
                # Still loading: answer 200 now, and wait inside the body.
                handed_off = True
                return _stream_response(
                    relay(ex, interval=options.loading_interval),
                    [("Content-Type", "text/event-stream; charset=utf-8")],
                )
            ex.got_lease(lease, trio.current_time() - started)
            upstream = await ex.open_upstream()
            if head.stream and upstream.status_code == 200:
                handed_off = True
                return _stream_response(
                    relay(ex, interval=options.loading_interval),
                    backward_headers(upstream.headers),
                )
            try:
                data = await upstream.aread()
            except httpx.HTTPError as exc:
                raise ex.upstream_error(exc) from None
            ex.status = upstream.status_code
            ex.first_byte()
            headers = Headers(backward_headers(upstream.headers))
            return Response(data, status=upstream.status_code, headers=headers)
        except ApiError as err:
            ex.failed(err)
            return error_response(err)
        finally:
            if not handed_off:
                await ex.aclose()

    for path in PROXIED:
        app.add_url_rule(path, endpoint=PROXIED[path], view_func=proxy, methods=["POST"])

    return app


def _stream_response(body: Any, headers: list[tuple[str, str]]) -> Response:
    resp = Response(body, status=200, headers=Headers(headers))
    for key, value in STREAM_HEADERS.items():
        resp.headers[key] = value
    # Quart's RESPONSE_TIMEOUT (60 s) would cut long generations and long loads.
    resp.timeout = None
    return resp


def _raw_header(name: bytes) -> bytes | None:
    for key, value in request.scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return None


def _target() -> str:
    qs: bytes = request.scope.get("query_string") or b""
    return request.path + ("?" + qs.decode("latin-1") if qs else "")


def _http(state: State) -> httpx.AsyncClient:
    if state.http is None:  # served without lifespan: create lazily
        state.http = make_http_client(read_timeout=state.options.frontend.read_timeout)
    return state.http
