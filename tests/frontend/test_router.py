"""The router in-process: one look-up in routes.py's table, the owner's handler, or a
404/405 in the path's own shape with the body drained first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ktd.frontend.inbound import DRAIN_BYTES, Receive, Scope, Send
from ktd.frontend.router import UI_HEADERS, Router
from ktd.frontend.routes import Match, Owner, normalise


class Calls:
    """Owners and Quart that record what reached them, and what was sent back."""

    def __init__(self) -> None:
        self.owned: list[tuple[Owner, Match, str]] = []
        self.app: list[tuple[str, bytes]] = []
        self.sent: list[dict[str, Any]] = []

    def owner(self, name: Owner) -> Any:
        async def handle(found: Match, scope: Scope, receive: Receive, send: Send) -> None:
            self.owned.append((name, found, scope["path"]))

        return handle

    async def quart(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        if scope["type"] == "http":
            body = (await receive())["body"]
        self.app.append((scope["type"], body))

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def router(self) -> Router:
        owners: dict[Owner, Any] = {o: self.owner(o) for o in ("proxy", "ollama", "ui")}
        return Router(self.quart, owners, (1 << 20, 5.0))

    def answer(self) -> tuple[int, dict[bytes, bytes], Any]:
        start, body = self.sent
        return start["status"], dict(start["headers"]), json.loads(body["body"])


def http(method: str, path: str, body: bytes = b"") -> Scope:
    headers = [(b"content-length", str(len(body)).encode())] if body else []
    return {"type": "http", "method": method, "path": path, "headers": headers}


def chunks(*parts: bytes) -> Receive:
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]

    async def receive() -> Any:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


@pytest.mark.parametrize(
    ("method", "path", "owner", "endpoint", "param"),
    [
        ("POST", "//v1/chat/completions/", "proxy", "chat", None),
        ("GET", "/v1/responses/resp_1", "proxy", "responses_get", "resp_1"),
        ("POST", "/api/chat", "proxy", "ollama_chat", None),
        ("HEAD", "/", "ollama", "root", None),
        ("DELETE", "/api/delete", "ollama", "delete", None),
        ("GET", "/ui/api/view", "ui", "view", None),
    ],
)
async def test_a_route_goes_to_its_owner_once_normalised(
    method: str, path: str, owner: str, endpoint: str, param: str | None
) -> None:
    calls = Calls()
    await calls.router()(http(method, path), chunks(b""), calls.send)
    ((got, found, seen),) = calls.owned
    assert (got, found.route.endpoint, found.param) == (owner, endpoint, param)
    assert seen == normalise(path) and not calls.app and not calls.sent


async def test_quart_gets_its_rows_with_the_body_read_and_every_other_scope() -> None:
    calls = Calls()
    router = calls.router()
    await router(http("GET", "/v1/models/org/m", b"x" * 10), chunks(b"x" * 4, b"x" * 6), calls.send)
    await router({"type": "lifespan"}, chunks(), calls.send)
    assert calls.app == [("http", b"x" * 10), ("lifespan", b"")] and not calls.owned


@pytest.mark.parametrize(
    ("method", "path", "status", "allow", "shape"),
    [
        ("GET", "/v1/chat/completions", 405, b"POST", "openai"),
        ("HEAD", "/v1/loads", 405, b"GET", "openai"),  # once Quart's: a 500
        ("GET", "/api/chat", 405, b"POST", "ollama"),
        ("PUT", "/", 405, b"GET, HEAD", "ollama"),
        ("POST", "/ui/api/view", 405, b"GET", "ui"),
        ("POST", "/health", 405, b"GET, HEAD", "openai"),
        ("GET", "/v1/nothing", 404, None, "openai"),
        ("GET", "/api/nothing", 404, None, "ollama"),
        ("GET", "/ui/nothing", 404, None, "ui"),
    ],
)
async def test_refusals_in_the_path_s_shape_after_the_body(
    method: str, path: str, status: int, allow: bytes | None, shape: str
) -> None:
    calls = Calls()
    receive = chunks(b"{", b"}")
    await calls.router()(http(method, path, b"{}"), receive, calls.send)
    got, headers, body = calls.answer()
    assert got == status and headers.get(b"allow") == allow
    assert (await receive())["type"] == "http.disconnect"  # the body was read to its end
    assert b"connection" not in headers  # so the connection stays usable
    if shape == "ollama":
        assert set(body) == {"error"} and (status == 405 or "Ollama route" in body["error"])
    else:
        assert body["error"]["code"] == ("method_not_allowed" if status == 405 else "not_found")
    assert all(h in headers.items() for h in UI_HEADERS) == (shape == "ui")
    assert not calls.owned and not calls.app


async def test_a_refusal_whose_body_is_too_long_to_drain_closes_the_connection() -> None:
    calls = Calls()
    big = b"x" * (DRAIN_BYTES + 1)
    await calls.router()(http("POST", "/nope", big), chunks(big), calls.send)
    status, headers, _ = calls.answer()
    assert status == 404 and headers[b"connection"] == b"close"


def test_every_owner_of_the_table_needs_a_handler() -> None:
    calls = Calls()
    with pytest.raises(ValueError, match="ui"):
        Router(
            calls.quart, {"proxy": calls.owner("proxy"), "ollama": calls.owner("ollama")}, (0, 1)
        )
