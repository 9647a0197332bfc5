"""The frontend's errors (``ktd.frontend.errors``): one table, its shapes, the daemon's
and the engine's errors mapped."""

from __future__ import annotations

import json
import string

from ktd.frontend import errors


def test_every_error_of_the_table_has_the_openai_shape_and_its_status() -> None:
    for name, kind in errors.KINDS.items():
        fields = {f: "x" for _, f, _, _ in string.Formatter().parse(kind.message) if f}
        err = errors.make(name, **fields)
        assert err.status == kind.status and err.type == kind.type, name
        body = json.loads(err.body())
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert "{" not in err.message, name  # every field filled
    unknown = errors.make("unknown_model", model="deepseek-v4", available=["z", "deepseek-v4-kt"])
    assert unknown.message.endswith("Available models: deepseek-v4-kt, z")
    assert errors.make("unknown_model", model="m", available=[]).message.endswith(
        "(none configured)"
    )
    assert "ktctl load m" in errors.make("not_loaded", model="m").message
    assert "out of memory" in errors.make("load_failed", model="m", reason="out of memory").message
    late = errors.make("load_failed", model="m", reason="r", retry_after=2.2)
    assert late.headers == {"Retry-After": "3"}
    allow = errors.make("method_not_allowed", method="PUT", path="/x", headers={"Allow": "GET"})
    assert allow.headers == {"Allow": "GET"} and allow.code == "method_not_allowed"


def test_from_control_maps_every_code() -> None:
    m = errors.from_control
    assert m("x", "unknown_model", "no", {"models": ["a", 1, "b"]}).status == 404
    assert "a, b" in m("x", "unknown_model", "no", {"models": ["b", "a"]}).message
    assert m("x", "unknown_model", "no", {}).status == 404
    assert m("x", "not_kt", "backend ds4", {}).status == 404
    lf = m("x", "load_failed", "failed", {"reason": "exit 1", "log_tail": ["a"]})
    assert lf.status == 503 and "exit 1" in lf.message
    assert m("x", "not_loaded", "", {}).status == 503
    assert m("x", "timeout", "", {}).status == 504
    assert m("x", "busy", "", {}).status == 503
    assert m("x", "something_new", "", {}).status == 503  # never a 500


def test_sse_error_event() -> None:
    event = errors.make("load_failed", model="m", reason="boom").sse()
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    obj = json.loads(event[6:])
    assert obj["error"]["code"] == "engine_failed"
    assert errors.ApiError(503, "x").sse().find(b'"code":503') > 0


def test_from_upstream_body_reads_sglang_and_openai_shapes() -> None:
    sg = errors.from_upstream_body(
        400,
        b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}',
    )
    assert (sg.status, sg.message, sg.type, sg.code) == (400, "too long", "BadRequestError", 400)
    oa = errors.from_upstream_body(
        429, b'{"error":{"message":"slow down","type":"rate","code":"x"}}'
    )
    assert (oa.message, oa.code) == ("slow down", "x")
    txt = errors.from_upstream_body(502, b"<html>bad gateway</html>")
    assert "bad gateway" in txt.message and txt.code == 502


def test_the_daemons_shutting_down_is_said_once() -> None:
    """Issue 31, item 8: "ktd is shutting down: ktd is shutting down"."""
    from ktd.frontend.errors import from_control

    err = from_control("m", "shutting_down", "ktd is shutting down", {})
    assert err.status == 503 and err.message == "ktd is shutting down"
    err = from_control("m", "shutting_down", "stopping engines", {})
    assert err.message == "ktd is shutting down: stopping engines"


def test_new_error_shapes() -> None:
    full = errors.from_control("m", "queue_full", "2 waiting", {"retry_after": 0.2})
    assert full.status == 429 and full.headers["Retry-After"] == "1"
    assert full.payload()["error"]["code"] == "queue_full"
    failed = errors.from_control("m", "load_failed", "x", {"reason": "boom", "retry_after": 12.5})
    assert failed.status == 503 and failed.headers["Retry-After"] == "13"
    # A load an evict ended has no backoff: still a Retry-After (issue 43, item 5).
    plain = errors.from_control("m", "load_failed", "x", {"reason": "boom"})
    assert plain.headers["Retry-After"] == "1"
    now = errors.from_control("m", "load_failed", "x", {"reason": "boom", "retry_after": 0.0})
    assert now.headers["Retry-After"] == "1"
    assert (
        errors.make("model_required", path="/generate", why=errors.ready_engines(["b", "a"])).status
        == 400
    )


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
