"""The frontend's one dispatch: every HTTP request looked up once in routes.py's table.

Why here, in front of Quart and not inside it: the proxied routes are answered
straight on ASGI messages (flow.py: Quart's per-request and per-chunk work cost more
than the proxying), and so are Ollama's answers and the dashboard's streams. Deciding
the route once, from one table, gives every path the same rules: an unknown path is a
404 and a wrong method a 405 with ``Allow``, each in the path's own error shape
(OpenAI's, Ollama's, the dashboard's), after the request body is read or drained so
a keep-alive connection stays usable. A known route goes to its owner; Quart's routes
(``owner="app"``) go to Quart with their body already read.

Quart still gets every non-HTTP scope (its lifespan: startup and shutdown tasks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ktd.frontend import errors
from ktd.frontend.afterlife import QuietAfterResponse
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import (
    ASGIApp,
    Disconnected,
    Receive,
    Scope,
    Send,
    drained,
    may_have_body,
    read_body_in_time,
    send_error,
)
from ktd.frontend.routes import (
    TABLE,
    ApiKind,
    Match,
    Owner,
    allowed_methods,
    api_of,
    match,
    normalise,
)

#: An owner's handler: the matched row (and the path's variable part), the ASGI triple.
Handler = Callable[[Match, Scope, Receive, Send], Awaitable[None]]

#: What the dashboard sends with every answer, its errors included.
UI_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


async def send_shaped(send: Send, api: ApiKind, err: ApiError, *, close: bool = False) -> None:
    """``err`` in the shape of a route of kind ``api``."""
    extra = UI_HEADERS if api == "ui" else None
    await send_error(send, err, close=close, ollama=api == "ollama", extra=extra)


class Router:
    """ASGI: normalise the path, find its row, hand the request to the row's owner.

    ``owners``: a handler for every owner in the table but ``"app"``, which is ``app``
    (Quart) reached with the body already read (``to_app``). ``bounds``: the body's
    size limit and time for Quart's routes (the owners read their own bodies).
    """

    def __init__(
        self, app: ASGIApp, owners: Mapping[Owner, Handler], bounds: tuple[int, float]
    ) -> None:
        missing = {r.owner for r in TABLE} - {"app", *owners}
        if missing:
            raise ValueError(f"no handler for the routes of {sorted(missing)}")
        self.app = app
        self.bounds = bounds
        self.owners: dict[Owner, Handler] = {**owners, "app": self._to_app}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = normalise(scope["path"])
        if path != scope["path"]:
            scope = dict(scope)
            scope["path"] = path
            scope["raw_path"] = path.encode("utf-8", "surrogateescape")
        found = match(scope["method"], path)
        if found is not None:
            await self.owners[found.route.owner](found, scope, receive, send)
            return
        await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """404 (no such path) or 405 (it answers other methods), the body drained first."""
        method, path = scope["method"], scope["path"]
        api = api_of(path)
        allowed = allowed_methods(path)
        if allowed:
            err = errors.make(
                "method_not_allowed",
                method=method,
                path=path,
                headers={"Allow": ", ".join(allowed)},
            )
        else:
            what = "Ollama " if api == "ollama" else ""
            err = errors.make("unknown_route", what=what, method=method, path=path)
        await send_shaped(send, api, err, close=not await drained(scope, receive))

    async def _to_app(self, found: Match, scope: Scope, receive: Receive, send: Send) -> None:
        """Quart's routes: read any body first, so even an error leaves a usable connection.

        Quart never sees the disconnect Hypercorn queues at the end of a response
        (afterlife.py): it would cancel the close of the connection or its idle timer.
        """
        quiet = QuietAfterResponse(receive, send)
        receive, send = quiet.receive, quiet.send
        if not may_have_body(scope):
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body_in_time(receive, *self.bounds)
        except ApiError as err:
            await send_error(send, err, close=True)
            return
        except Disconnected:
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
