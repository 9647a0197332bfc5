"""The frontend's route table (``ktd.frontend.routes``): every path in one row, normalised
paths, the model's names (LoRA, Ollama's tags), the query passed on."""

from __future__ import annotations

import pytest

from ktd.frontend.errors import ApiError
from ktd.frontend.ollama import ollama_alias
from ktd.frontend.routes import (
    TABLE,
    Match,
    Route,
    allowed_methods,
    api_of,
    forwarded_query,
    match,
    normalise,
    ollama_name,
    response_id_in,
    rows,
    split_lora,
)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("//v1/chat/completions", "/v1/chat/completions"),
        ("/v1//models/", "/v1/models"),
        ("/", "/"),
        ("//", "/"),
        ("/generate/", "/generate"),
    ],
)
def test_normalise(raw: str, clean: str) -> None:
    assert normalise(raw) == clean


def test_route_table_covers_sglang_surface() -> None:
    for path in (
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/v1/score",
        "/v1/classify",
        "/v1/tokenize",
        "/v1/detokenize",
        "/generate",
        "/v1/audio/transcriptions",
    ):
        found = match("POST", path)
        assert found is not None and found.route.path == path and found.route.owner == "proxy"
        assert match("GET", path) is None and allowed_methods(path) == ["POST"]
    got = match("GET", "/v1/responses/resp_abc")
    assert got is not None and got.param == "resp_abc"
    cancel = match("POST", "/v1/responses/resp_abc/cancel")
    assert cancel is not None and cancel.route.endpoint == "responses_cancel"
    assert match("GET", "/v1/responses/a/b") is None
    assert _route("POST", "/v1/audio/transcriptions").body == "multipart"
    assert _route("POST", "/generate").model == "optional"


def _route(method: str, path: str) -> Route:
    found = match(method, path)
    assert found is not None
    return found.route


def test_one_table_every_path_in_one_row_and_one_endpoint_each() -> None:
    """Endpoints name handlers, Quart rules and metric labels: one each. A path's rows
    share one owner's shape, and the variable parts match what they should."""
    endpoints = [r.endpoint for r in TABLE]
    assert len(endpoints) == len(set(endpoints))
    for route in TABLE:
        assert route.methods and all(m == m.upper() for m in route.methods)
        assert route.api == api_of(route.path.split("<")[0] or "/"), route
        if route.owner != "proxy":
            assert route.body == "none" and not route.remember and not route.query
    model = _route("GET", "/v1/models/org/some-model")
    assert model.endpoint == "retrieve_model" and model.owner == "app"
    assert match("GET", "/v1/models/org/x") == Match(model, "org/x")
    assert _route("HEAD", "/api/blobs/sha256:ab/cd").endpoint == "blobs"
    assert _route("HEAD", "/").open and not _route("GET", "/api/tags").open
    assert allowed_methods("/api/chat") == ["POST"] and allowed_methods("/nope") == []
    assert allowed_methods("/health") == ["GET", "HEAD"]
    assert match("HEAD", "/v1/loads") is None  # a proxied GET has no HEAD: a 405
    assert api_of("/ui/api/x") == "ui" and api_of("/") == "ollama" and api_of("/x") == "openai"
    assert rows("/v1/responses/" + "a" * 201) == ((), None)


def test_lora_split_and_response_ids() -> None:
    assert split_lora("m1:sql") == ("m1", "sql")
    assert split_lora("m1") == ("m1", None)
    assert split_lora("m1:") == ("m1:", None)
    assert response_id_in(b'{"id":"resp_x1","object":"response"}') == "resp_x1"
    assert response_id_in(b'event: x\ndata: {"response": {"id": "resp_9"}}') == "resp_9"
    assert response_id_in(b'{"id":"chatcmpl-1"}') is None


def test_ollama_and_loads_routes() -> None:
    for path in ("/api/chat", "/api/generate"):
        found = match("POST", path)
        assert found is not None and found.route.api == "ollama" and found.route.model == "required"
    loads = match("GET", "/v1/loads")
    assert loads is not None and loads.route.body == "none" and loads.route.model == "optional"
    assert match("POST", "/v1/loads") is None and allowed_methods("/v1/loads") == ["GET"]
    assert forwarded_query(loads.route, b"include=core&api_key=k&dp_rank=0") == (
        b"include=core&dp_rank=0"
    )
    assert forwarded_query(loads.route, b"api_key=k") == b""
    assert forwarded_query(_route("POST", "/v1/chat/completions"), b"include=core") == b""
    # Ollama's name:tag: :latest is the alias; another tag is kept (and refused by flow.py).
    assert ollama_name("m1:latest") == ("m1", None)
    assert ollama_name("m1") == ("m1", None)
    assert ollama_name("m1:sql") == ("m1", "sql")
    assert ollama_name(":latest") == (":latest", None)
    with pytest.raises(ApiError) as err:
        ollama_alias("m1:sql")
    assert err.value.status == 404 and "/v1/chat/completions" in err.value.message
