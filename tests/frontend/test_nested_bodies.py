"""Hostile JSON bodies on every route of the frontend (issue 43): nested deeper than ktd
decodes, wrong types, big; each route that reads its body answers 400 in its own shape
(OpenAI's, Ollama's, the dashboard's), none answers 5xx or drops the connection, and the
frontend serves on. The body decoders themselves are fuzzed with hypothesis (depth, size,
type); the routes are driven in-process against a fake daemon (every row of
``routes.TABLE``, every method)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from ktd import foreign
from ktd import protocol as p
from ktd.core.keys import KeyRing
from ktd.frontend import keepalive, routes
from ktd.frontend.body import parse_head
from ktd.frontend.errors import ApiError
from ktd.frontend.ui.access import Access
from ktd.frontend.ui.asgi import UiRequest
from tests.frontend.frontend_fakes import StatusDaemon
from tests.frontend.frontend_helpers import StartFrontend
from tests.hypo import budget

KEY = "sk-nested"
DEEP = 1000  # the frame: 1 KB of brackets

# ---------------------------------------------------------------- the decoders


def deep(depth: int, kind: str) -> str:
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=30,
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, int]:
    """(a body, how deep its deepest value nests): routing fields of any type, a field
    nested to any depth, a big field, or bytes that are no JSON at all."""
    how = draw(st.sampled_from(["deep", "deep", "typed", "big", "raw"]))
    if how == "raw":
        return draw(st.binary(max_size=200)), 0
    fields: dict[str, str] = {"model": json.dumps(draw(st.one_of(st.just("m"), json_values)))}
    depth = 1
    if draw(st.booleans()):
        fields["stream"] = json.dumps(draw(json_values))
    if how == "deep":
        n = draw(st.one_of(st.integers(1, 300), st.integers(300, 50_000)))
        where = draw(st.sampled_from(["messages", "keep_alive", "model", "stream", "x"]))
        fields[where] = deep(n, draw(st.sampled_from(["array", "object"])))
        depth = 1 + n
    elif how == "big":
        fields["prompt"] = json.dumps("x" * draw(st.integers(0, 200_000)))
    text = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields.items()) + "}"
    if draw(st.booleans()) and how == "deep":
        text = fields[where]  # the nesting at the top, no object around it
        depth -= 1
    return text.encode(), depth


async def _ui_json(body: bytes) -> Any:
    chunks = [body]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop() if chunks else b"", "more_body": False}

    async def send(message: Any) -> None:
        raise AssertionError("the body's reading sends nothing")

    scope = {"type": "http", "headers": [], "query_string": b"", "method": "POST"}
    req = UiRequest(scope, receive, send, Access(KeyRing(), control=False))
    return await req.json()


@budget(100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=bodies(), route=st.sampled_from(["/v1/chat/completions", "/api/chat", "/api/generate"]))
def test_the_body_decoders_answer_400_or_read_it(case: tuple[bytes, int], route: str) -> None:
    """Every reading of a request body: the routing head (OpenAI's and Ollama's), the
    Ollama extras, the dashboard's JSON. A 400 ``ApiError`` or a value, nothing else."""
    body, depth = case
    too_deep = depth > foreign.MAX_DEPTH
    for read in (
        lambda: parse_head(body, require_model=False),
        lambda: parse_head(body, ollama=True),
        lambda: trio.run(_ui_json, body),
    ):
        try:
            read()
        except ApiError as err:
            assert err.status in (400, 413), err.message  # 413: over the dashboard's limit
            if too_deep and err.status == 400:
                assert "nested too deeply" in err.message, err.message
        else:
            assert not too_deep
    try:
        keepalive.read(body, route)
    except ValueError as exc:  # keep_alive's own type error, which the route answers 400
        assert str(exc).startswith("keep_alive:"), exc


# ---------------------------------------------------------------- every route


def _paths() -> Iterator[tuple[routes.Route, str, str]]:
    """Each row of the table, each method, with its variable part filled in."""
    fill = {"<response_id>": "resp_1", "<path:model_id>": "m", "<path:digest>": "sha256:ab"}
    for route in routes.TABLE:
        path = route.path
        for var, value in fill.items():
            path = path.replace(var, value)
        for method in route.methods:
            if method != "HEAD":
                yield route, method, path


def _reads_json(route: routes.Route, method: str) -> bool:
    """Whether the route reads its body as JSON (and so must refuse a deep one)."""
    if route.owner == "proxy":
        return route.body == "json"
    if route.owner == "ollama":
        return route.endpoint == "show"
    return route.owner == "ui" and method == "POST" and route.endpoint != "logout"


def _message(route: routes.Route, doc: Any) -> str:
    """The error's words, where the route's shape puts them."""
    if route.api == "ollama":
        assert isinstance(doc["error"], str), doc
        return str(doc["error"])
    return str(doc["error"]["message"])


@pytest.fixture
async def daemon(runtime_dir: Path, nursery: trio.Nursery) -> StatusDaemon:
    d = StatusDaemon(f"ipc://{runtime_dir}/control.sock")
    d.put(p.EngineInfo(alias="m", state="stopped"))
    await nursery.start(d.run)
    return d


async def test_every_route_answers_a_deeply_nested_body_in_its_own_shape(
    daemon: StatusDaemon, start_frontend: StartFrontend
) -> None:
    """A route that reads its body: 400 in its shape, saying why. Any route: no 500
    (what a route answers a body it does not read is its own: 200, 404, 503 with no
    engine ready...), and the frontend serves on."""
    fe = await start_frontend(api_keys=[KEY], ui_control=True)
    headers = {"Authorization": f"Bearer {KEY}", "X-Ktd-UI": "1"}
    inner = '{"model": "m", "messages": ' + deep(DEEP, "array") + "}"
    cases = [  # (body, what the 400 says); each under the dashboard's 64 KiB: all read
        (inner.encode(), "nested too deeply"),
        (deep(DEEP, "object").encode(), "nested too deeply"),
        (deep(30_000, "array").encode(), "nested too deeply"),
        (b'["model", "m"]', ""),  # the wrong type at the top
        (b'{"model": "\xff"}', ""),  # no UTF-8
    ]
    seen = []
    async with fe.client(headers=headers) as c:
        for route, method, path in _paths():
            for body, says in cases:
                async with c.stream(method, path, content=body) as r:
                    status = r.status_code
                    doc = json.loads(await r.aread()) if status >= 400 else None
                where = f"{method} {path}: {status} {doc}"
                assert status != 500, where
                if _reads_json(route, method):
                    assert status == 400, where
                    assert says in _message(route, doc), where
            seen.append(path)
        assert (await c.get("/health")).status_code == 200  # still serving
    assert len(seen) >= len(routes.TABLE)
