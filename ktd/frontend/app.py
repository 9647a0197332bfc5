"""The Quart-Trio app: OpenAI routes in front of ktd's engines.

Every route is a row of one table (routes.py), looked up once by the router
(router.py) in front of Quart: the proxied routes (flow.py: chat, completions,
embeddings, Responses, Anthropic Messages, SGLang's native and scoring routes,
audio, Ollama's chat and generate, ``/v1/loads``), Ollama's own answers (ollama.py)
and the dashboard (ui/) are answered there on raw ASGI, so no per-request or
per-chunk Quart work sits on the hot path; the upstream hop is a small pooled
HTTP/1.1 client on trio (upstream.py). Quart serves the rows the table gives it
(``/v1/models`` and ``/v1/models/{id}``, ``/health``, ``/metrics``, the worker
info sglang-router reads), with the body already read (afterlife.py: why it never
sees the disconnect that ends a response). The app is still one QuartTrio object
served by ``hypercorn.trio.serve``: the router wraps ``app.asgi_app``, as any ASGI
middleware would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core.keys import Policy
from ktd.frontend import catalog, errors, gateway_metrics, patches, ui, waitroutes, worker_info
from ktd.frontend.errors import ApiError
from ktd.frontend.flow import Flow
from ktd.frontend.ollama import OllamaRoutes
from ktd.frontend.origin import Guard, OriginPolicy
from ktd.frontend.promtext import merge
from ktd.frontend.proxy import control_error
from ktd.frontend.router import Handler, Router
from ktd.frontend.routes import TABLE, Owner
from ktd.frontend.scrape import scrape_engines
from ktd.frontend.state import FrontendOptions, State

_JSON = "application/json"


def _json_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    resp = Response(body, status=status, content_type=_JSON)
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


def error_response(err: ApiError) -> Response:
    return _json_response(err.status, err.body(), err.headers)


def create_app(options: FrontendOptions) -> QuartTrio:
    """Build the app. Background tasks (control client, heartbeats) start with it.

    The layers, outside in: the ``Guard`` (Origin, Host, JSON bodies, WebSockets), the
    ``Router`` (routes.py's table, looked up once: the proxy, Ollama's answers and the
    dashboard on raw ASGI, a 404 or 405 in the path's shape), then Quart: the
    frontend's own answers, its rules made from the same table."""
    patches.install(options.frontend.send_timeout)  # refuses an unchecked Hypercorn
    app = QuartTrio("ktd.frontend")
    app.config["MAX_CONTENT_LENGTH"] = None  # counted by read_limited, OpenAI-shaped 413
    app.config["BODY_TIMEOUT"] = options.body_timeout
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    state = State(options)
    app.extensions["ktd"] = state
    owners: dict[Owner, Handler] = {
        "proxy": Flow(state).proxy,
        "ollama": OllamaRoutes(state).answer,
        "ui": ui.install(app, state).answer,
    }
    router = Router(app.asgi_app, owners, options.body_bounds)  # type: ignore[arg-type]
    front = options.frontend
    policy = OriginPolicy(
        front.bind, allowed_origins=front.allowed_origins, allowed_hosts=front.allowed_hosts
    )
    app.asgi_app = Guard(router, policy)  # type: ignore[method-assign,assignment]
    state.metrics.add_pool_gauge(state.upstream.counts)
    state.metrics.add_budget(state.broker.budget)

    @app.before_serving
    async def _start() -> None:
        await app.nursery.start(state.broker.run)
        app.nursery.start_soon(state.upstream.watchdog)
        app.nursery.start_soon(state.waits.run)

    @app.after_serving
    async def _stop() -> None:
        await state.broker.aclose()
        await state.upstream.aclose()

    _install_error_handlers(app)
    views = {**_own_views(state), **worker_info.views(state), **waitroutes.views(state)}
    _install_app_routes(app, views)
    gateway_metrics.install(app, state, interval=options.heartbeat_interval)
    return app


def _install_app_routes(app: QuartTrio, views: dict[str, Callable[..., Any]]) -> None:
    """Quart's rules, one per ``owner="app"`` row of routes.py, each to its view."""
    for route in TABLE:
        if route.owner == "app":
            view = views.pop(route.endpoint)
            app.add_url_rule(
                route.path, endpoint=route.endpoint, view_func=view, methods=list(route.methods)
            )
    if views:
        raise ValueError(f"views without a route in routes.py: {sorted(views)}")


def _install_error_handlers(app: QuartTrio) -> None:
    """Every error Quart meets, in OpenAI's shape: ours, an HTTP error of its own (the
    router answers unknown routes and methods first), and a crash."""

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
        return error_response(errors.make("internal", message="internal frontend error"))


def _own_views(state: State) -> dict[str, Callable[..., Any]]:
    """What the frontend answers itself: /health, /metrics, the model list (by endpoint)."""

    async def health() -> Response:
        """Liveness for anyone; the daemon's pid and version only for a key's holder."""
        known = not state.keys.enabled or _has_key(state)
        try:
            pong = await state.broker.ping()
        except (Unreachable, ControlError) as exc:
            detail = str(exc) if known else "no answer"
            return error_response(errors.make("daemon_unreachable", detail=detail))
        if not known:
            return _json_response(200, b'{"status":"ok"}')
        body = {"status": "ok", "daemon": {"version": pong.version, "pid": pong.pid}}
        return _json_response(200, errors._encoder.encode(body))

    async def metrics() -> Response:
        """ktd's own metrics, then every ready engine's SGLang metrics labelled by alias.

        Engines are scraped concurrently (``--enable-metrics`` in their
        extra_args; without it SGLang has no /metrics and is skipped), each with
        a short timeout so one stuck engine cannot stall the scrape.
        """
        if not state.options.frontend.metrics_public:
            state.keys.of(request.scope)  # with keys set: a key's holder
        engines = await catalog.all_engines(state.broker)
        state.metrics.update_engines(engines)
        scraped = await scrape_engines(state.upstream, engines)
        data, ctype = state.metrics.render()
        if scraped:
            data += merge(scraped).encode()
        return Response(data, status=200, content_type=ctype)

    async def models() -> Response:
        data = _visible(await _model_cards(state), state.keys.of(request.scope))
        return _json_response(200, errors._encoder.encode({"object": "list", "data": data}))

    async def retrieve_model(model_id: str) -> Response:
        """The SDK's ``models.retrieve``: one card, or OpenAI's 404 naming what exists."""
        cards = _visible(await _model_cards(state), state.keys.of(request.scope))
        for card in cards:
            if card["id"] == model_id:
                return _json_response(200, errors._encoder.encode(card))
        raise errors.make("unknown_model", model=model_id, available=[str(c["id"]) for c in cards])

    return {
        "health": health,
        "metrics": metrics,
        "models": models,
        "retrieve_model": retrieve_model,
    }


def _has_key(state: State) -> bool:
    """Whether this request shows a good key (``ApiKeys.of`` without its 401)."""
    try:
        state.keys.of(request.scope)
    except ApiError:
        return False
    return True


def _visible(cards: list[dict[str, Any]], policy: Policy | None) -> list[dict[str, Any]]:
    """The cards a key may see: the models in its scope (every one without keys)."""
    if policy is None:
        return cards
    return [c for c in cards if policy.allows(str(c.get("parent") or c["id"]).split(":")[0])]


async def _model_cards(state: State) -> list[dict[str, Any]]:
    """Served aliases from the daemon, plus ``alias:adapter`` for each ready engine's LoRA.

    The adapters come from the engine's own ``/v1/models`` (SGLang lists them
    with ``parent`` = its served name), asked concurrently and cached briefly.
    """
    try:
        reply = await state.broker.request(p.Models())
    except (Unreachable, ControlError) as exc:
        raise control_error("", exc) from None
    if not isinstance(reply, p.ModelsReply):
        raise errors.make("daemon_unreachable", detail=f"unexpected reply {type(reply).__name__}")
    cards: list[dict[str, Any]] = [
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
    ready = {e.alias: e for e in await catalog.ready_engines(state.broker)}
    adapters: dict[str, list[str]] = {}

    async def ask(alias: str, url: str) -> None:
        names = await catalog.engine_adapters(state.upstream, url, alias)
        if names:
            adapters[alias] = names

    async with trio.open_nursery() as nursery:
        for alias, info in ready.items():
            if info.url:
                nursery.start_soon(ask, alias, info.url)
    for base in [c for c in cards if c["id"] in adapters]:
        for name in adapters[base["id"]]:
            cards.append(
                {
                    "id": f"{base['id']}:{name}",
                    "object": "model",
                    "created": state.created,
                    "owned_by": "ktd",
                    "state": base["state"],
                    "parent": base["id"],
                }
            )
    return cards
