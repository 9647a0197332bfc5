"""Pure parts of the wider proxy: route table, path normalising, multipart, LoRA, metrics merge,
Ollama's names, streams, errors and ``/api/ps`` rows."""

from __future__ import annotations

import json

import msgspec
import pytest

from ktd import multipart, ollama_shapes
from ktd import protocol as p
from ktd.frontend import errors
from ktd.frontend.body import ollama_stream, parse_head
from ktd.frontend.errors import ApiError
from ktd.frontend.ollama import ollama_alias, ps_entry, ps_rows
from ktd.frontend.promtext import label_sample, merge
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
from ktd.sim.cli import parse
from ktd.sim.lora import adapters, lora_enabled


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


def test_parse_head_optional_model_and_depth() -> None:
    assert parse_head(b'{"text": "x"}', require_model=False).model is None
    with pytest.raises(ApiError) as err:
        parse_head(b'{"text": "x"}')
    assert err.value.status == 400
    with pytest.raises(ApiError) as err:
        parse_head(b'{"model": "m", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert err.value.status == 400 and "nested too deeply" in err.value.message


def test_multipart_fields_without_touching_files() -> None:
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nm1\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n\x00\x01--\r\n\r\n"
        b"--XyZ--\r\n"
    )
    ctype = 'multipart/form-data; boundary="XyZ"'
    assert multipart.text_field(body, ctype, "model") == "m1"
    assert multipart.text_field(body, ctype, "file") is None  # a file, not a text field
    parts = {p.name: p for p in multipart.parts(body, ctype)}
    assert parts["file"].data == b"\x00\x01--\r\n" and parts["file"].content_type == "audio/wav"
    for bad in ("application/json", "multipart/form-data"):
        with pytest.raises(multipart.MultipartError):
            multipart.text_field(body, bad, "model")
    with pytest.raises(multipart.MultipartError):
        multipart.text_field(b"--XyZ\r\n", ctype, "model")


def test_sim_lora_flags() -> None:
    argv = ["--model", "/m", "--enable-lora", "--lora-paths", "a=/l/a", "/l/b",
            '{"lora_name": "c", "lora_path": "/l/c"}']  # fmt: skip
    parsed = parse(argv, "kt").server_args
    assert adapters(parsed) == {"a": "/l/a", "/l/b": "/l/b", "c": "/l/c"}
    assert adapters(parse(["--model", "/m", "--lora-paths=x=/y"]).server_args) == {"x": "/y"}
    assert lora_enabled(parse(["--model", "/m", "--enable-lora"]).server_args)
    assert not lora_enabled(parse(["--model", "/m"]).server_args)


def test_metrics_merge_labels_by_alias_and_keeps_one_header_per_family() -> None:
    text = (
        "# HELP sglang:num_running_reqs Running.\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="x"} 2.0\n'
        "# TYPE sglang:lat histogram\n"
        'sglang:lat_bucket{le="1"} 1\nsglang:lat_count 1\n'
    )
    out = merge([("a", text), ("b", text)])
    assert out.count("# TYPE sglang:num_running_reqs gauge") == 1
    assert 'sglang:num_running_reqs{alias="a",model_name="x"} 2.0' in out
    assert 'sglang:num_running_reqs{alias="b",model_name="x"} 2.0' in out
    assert 'sglang:lat_count{alias="b"} 1' in out
    lines = out.splitlines()
    assert lines.index('sglang:lat_count{alias="a"} 1') > lines.index("# TYPE sglang:lat histogram")
    assert label_sample('x{alias="own"} 1', "a") == 'x{alias="own"} 1'
    assert label_sample("x{} 1", 'q"') == 'x{alias="q\\""} 1'
    assert merge([]) == ""


def test_new_error_shapes() -> None:
    full = errors.from_control("m", "queue_full", "2 waiting", {"retry_after": 0.2})
    assert full.status == 429 and full.headers["Retry-After"] == "1"
    assert full.payload()["error"]["code"] == "queue_full"
    failed = errors.from_control("m", "load_failed", "x", {"reason": "boom", "retry_after": 12.5})
    assert failed.status == 503 and failed.headers["Retry-After"] == "13"
    plain = errors.from_control("m", "load_failed", "x", {"reason": "boom"})
    assert "Retry-After" not in plain.headers
    assert (
        errors.make("model_required", path="/generate", why=errors.ready_engines(["b", "a"])).status
        == 400
    )


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


@pytest.mark.parametrize(
    ("raw", "stream"),
    [
        (b'{"model": "m"}', True),  # SGLang's pydantic default
        (b'{"model": "m", "stream": false}', False),
        (b'{"model": "m", "stream": 0}', False),
        (b'{"model": "m", "stream": "No"}', False),
        (b'{"model": "m", "stream": "yes"}', True),
        (b'{"model": "m", "stream": null}', True),  # SGLang's 400 decides, not ours
    ],
)
def test_ollama_stream_reads_as_pydantic_does(raw: bytes, stream: bool) -> None:
    assert parse_head(raw, ollama=True).stream is stream
    assert ollama_stream(msgspec.UNSET) is True


def test_ollama_error_shapes_and_ps_rows() -> None:
    err = errors.make(
        "queue_full", model="m1", message="1 request(s) already waiting (max_queue 1)"
    )
    assert json.loads(err.ollama_body()) == {"error": err.message}
    assert err.ndjson().endswith(b"}\n") and err.ndjson().count(b"\n") == 1
    est = {"host_bytes": 100, "gpu_bytes": 30, "gpu_weights_bytes": 20, "ctx": 512}
    now = 1_800_000_000.0
    ready = p.EngineInfo(alias="m1", state="ready", ttl=0.0)
    row = ps_entry(ready, "/models/m1", est, now)
    assert (row["name"], row["size"], row["size_vram"], row["context_length"]) == (
        "m1:latest", 130, 30, 512,
    )  # fmt: skip
    assert row["expires_at"].startswith("2") and int(row["expires_at"][:4]) > 2300  # Forever
    timed = ps_entry(msgspec.structs.replace(ready, ttl=60.0, expires_at=now + 42), "", est, now)
    assert timed["expires_at"] == ollama_shapes.timestamp(now + 42)
    busy = ps_entry(msgspec.structs.replace(ready, ttl=60.0), "", None, now)
    assert busy["expires_at"] == ollama_shapes.timestamp(now + 60) and busy["size"] == 0
    assert row["digest"] == ps_entry(ready, "/models/m1", None, now)["digest"] != busy["digest"]


def test_ps_lists_an_asleep_engine_without_vram_until_its_sleep_ttl() -> None:
    """Asleep: loaded in host RAM, none in VRAM; ``expires_at`` is when ``sleep_ttl``
    stops it. Ready ones are unchanged; engines on their way are not listed."""
    est = {"host_bytes": 100, "gpu_bytes": 30, "ctx": 512}
    now = 1_800_000_000.0
    asleep = p.EngineInfo(
        alias="m1", state="asleep", ttl=60.0, expires_at=now + 5, asleep_since=now - 100
    )
    forever = ps_entry(asleep, "/models/m1", est, now)
    assert (forever["size"], forever["size_vram"], forever["context_length"]) == (130, 0, 512)
    assert int(forever["expires_at"][:4]) > 2300  # no sleep_ttl: Forever, not the idle TTL
    timed = ps_entry(msgspec.structs.replace(asleep, sleep_ttl=600.0), "", est, now)
    assert timed["expires_at"] == ollama_shapes.timestamp(now + 500)
    unknown = msgspec.structs.replace(asleep, sleep_ttl=600.0, asleep_since=None)
    assert ps_entry(unknown, "", est, now)["expires_at"] == ollama_shapes.timestamp(now + 600)
    engines = [
        p.EngineInfo(alias="r", state="ready", ttl=60.0, expires_at=now + 30),
        msgspec.structs.replace(asleep, alias="a", sleep_ttl=600.0),
        p.EngineInfo(alias="w", state="waking"),
        p.EngineInfo(alias="s", state="sleeping"),
        p.EngineInfo(alias="l", state="starting"),
    ]
    rows = ps_rows(engines, {}, {"r": est, "a": est}, now)
    assert [(r["name"], r["size_vram"]) for r in rows] == [("a:latest", 0), ("r:latest", 30)]


def test_engine_errors_take_their_route_s_shape_and_keep_its_words() -> None:
    sglang = json.dumps(
        {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}
    ).encode()
    openai_shape = json.loads(errors.in_route_shape("openai", 400, sglang) or b"")
    assert openai_shape == {
        "error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}
    }
    claude = json.loads(errors.in_route_shape("anthropic", 400, sglang) or b"")
    assert claude == {"type": "error", "error": {"type": "BadRequestError", "message": "too long"}}
    assert json.loads(errors.in_route_shape("ollama", 400, sglang) or b"") == {"error": "too long"}
    text = json.loads(errors.in_route_shape("openai", 502, b"Bad Gateway") or b"")
    assert text["error"]["message"] == "Bad Gateway" and text["error"]["type"] == "server_error"
    # Already in the route's shape: passed as it came.
    for api, body in (
        ("openai", {"error": {"message": "m", "type": "t"}}),
        ("anthropic", {"type": "error", "error": {"type": "t", "message": "m"}}),
        ("ollama", {"error": "m"}),
    ):
        assert errors.in_route_shape(api, 400, json.dumps(body).encode()) is None
