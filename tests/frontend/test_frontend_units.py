"""Pure parts: body parsing, error shapes, auth, header filtering."""

from __future__ import annotations

import json
import string

import pytest

from ktd import protocol as p
from ktd.core import states as S
from ktd.frontend import errors
from ktd.frontend.auth import ApiKeys
from ktd.frontend.body import check_declared_length, parse_head, read_limited
from ktd.frontend.errors import ApiError
from ktd.frontend.metrics import ENGINE_STATES, EngineCollector, Metrics
from ktd.frontend.proxy import forward_headers, loading_comment


def test_parse_head_reads_only_model_and_stream() -> None:
    body = (
        b'{"messages": [{"role": "user", "content": "hi"}], "model": "m",'
        b' "stream": true, "x": {"y": [1,2]}}'
    )
    head = parse_head(body)
    assert head.model == "m"
    assert head.stream is True
    assert parse_head(b'{"model": "m"}').stream is False
    assert parse_head(b'{"model": "m", "stream": null}').stream is False


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"", None, "empty"),
        (b"{not json", None, "parse"),
        (b"[1, 2]", None, "object"),
        (b'"model"', None, "object"),
        (b"{}", "model", "must provide a model"),
        (b'{"model": null}', "model", "must provide a model"),
        (b'{"model": 3}', "model", "expected a string"),
        (b'{"model": ["a"]}', "model", "expected a string"),
        (b'{"model": ""}', "model", "empty"),
        (b'{"model": "m", "stream": "yes"}', "stream", "boolean"),
        (b'{"model": "m"', None, "parse"),
        (b"\xff\xfe", None, "parse"),
    ],
)
def test_parse_head_rejects_with_400(body: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_head(body)
    err = info.value
    assert err.status == 400
    assert err.param == param
    assert fragment in err.message
    shape = json.loads(err.body())
    assert set(shape["error"]) == {"message", "type", "param", "code"}
    assert shape["error"]["type"] == "invalid_request_error"


def test_declared_length_check() -> None:
    check_declared_length(None, 10)
    check_declared_length(10, 10)
    check_declared_length(10**9, 0)  # 0 = unlimited
    with pytest.raises(ApiError) as info:
        check_declared_length(11, 10)
    assert info.value.status == 413


async def test_read_limited_counts_while_reading() -> None:
    async def chunks(n: int, size: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield b"x" * size

    assert await read_limited(chunks(3, 4), 12) == b"x" * 12
    assert await read_limited(chunks(1, 4), 0) == b"xxxx"
    with pytest.raises(ApiError) as info:
        await read_limited(chunks(4, 4), 12)
    assert info.value.status == 413


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


def test_api_keys() -> None:
    ApiKeys([]).check(None)  # no keys: open
    keys = ApiKeys(["sk-one", "sk-two", "sk-ü"])
    keys.check(b"Bearer sk-two")
    keys.check("bearer sk-one")
    keys.check("Bearer sk-ü".encode())
    for bad, code in [
        (None, "missing_api_key"),
        (b"", "missing_api_key"),
        (b"Basic c2stb25l", "missing_api_key"),
        (b"Bearer", "missing_api_key"),
        (b"Bearer sk-three", "invalid_api_key"),
        (b"Bearer \xff\xfe", "invalid_api_key"),
        ("Bearer sk-ü-not".encode(), "invalid_api_key"),
    ]:
        with pytest.raises(ApiError) as info:
            keys.check(bad)
        assert info.value.status == 401
        assert info.value.code == code
        assert b"sk-" not in info.value.body()  # never echo a key


def test_forward_headers_drops_credentials_and_hop_by_hop() -> None:
    raw = [
        (b"Host", b"x"),
        (b"Content-Type", b"application/x-www-form-urlencoded"),
        (b"Content-Length", b"12"),
        (b"Authorization", b"Bearer sk-secret"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"X-Hop", b"1"),
        (b"Accept", b"text/event-stream"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Accept-Encoding", b"gzip"),
        (b"X-Request-Id", b"abc"),
    ]
    kept = dict(forward_headers(raw))
    assert kept == {
        b"content-type": b"application/json",
        b"accept": b"text/event-stream",
        b"x-request-id": b"abc",
    }


def test_loading_comment_is_an_sse_comment() -> None:
    assert loading_comment("m", 4.7) == b": loading m 4s\n\n"
    assert loading_comment("m\n\ndata: x", 0) == b": loading mdata: x 0s\n\n"
    assert loading_comment("m", 12.2, 300.4) == b": loading m 12s of ~300s expected\n\n"
    assert loading_comment("m", 2.5, verb="waking") == b": waking m 2s\n\n"


def test_engine_state_gauge_has_every_state_sleep_included() -> None:
    """``ktd_engine_state{alias,state}``: one series per state of ktd.core.states, so an
    asleep engine reads 1 for ``asleep`` (and a dashboard can sum the sleepers)."""
    assert set(ENGINE_STATES) == set(S.ALL) >= {"sleeping", "asleep", "waking"}
    collector = EngineCollector()
    collector.snapshot = [
        p.EngineInfo(alias="m1", state="asleep"),
        p.EngineInfo(alias="m2", state="waking"),
    ]
    [family] = [f for f in collector.collect() if f.name == "ktd_engine_state"]
    on = {(s.labels["alias"], s.labels["state"]) for s in family.samples if s.value == 1.0}
    assert on == {("m1", "asleep"), ("m2", "waking")}
    assert len(family.samples) == 2 * len(S.ALL)


def test_the_daemons_shutting_down_is_said_once() -> None:
    """Issue 31, item 8: "ktd is shutting down: ktd is shutting down"."""
    from ktd.frontend.errors import from_control

    err = from_control("m", "shutting_down", "ktd is shutting down", {})
    assert err.status == 503 and err.message == "ktd is shutting down"
    err = from_control("m", "shutting_down", "stopping engines", {})
    assert err.message == "ktd is shutting down: stopping engines"


def test_engine_in_flight_is_rendered_under_its_name_and_its_deprecated_one() -> None:
    """``ktd_engine_leases`` stays one release, for the dashboards and alerts that read it."""
    metrics = Metrics()
    metrics.update_engines([p.EngineInfo(alias="m1", state=p.EngineState.READY, in_flight=3)])
    text = metrics.render()[0].decode()
    assert 'ktd_engine_in_flight{alias="m1"} 3.0' in text
    assert 'ktd_engine_leases{alias="m1"} 3.0' in text
    assert "# HELP ktd_engine_leases Deprecated: use ktd_engine_in_flight." in text
