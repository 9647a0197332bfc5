"""The app in-process under Hypercorn, against a fake daemon and a fake engine.

White-box where it matters: the fake engine sees hang-ups on its own socket,
the fake daemon counts claims and reported requests, and the app's httpx pool
is inspected for leaks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from ktd.frontend.upstream import UpstreamPool
from tests.frontend.frontend_fakes import FakeDaemon, FakeEngine
from tests.frontend.frontend_helpers import (
    CHAT,
    Frontend,
    StartFrontend,
    body,
    held_stream,
    wait_for,
)


def _pool(fe: Frontend) -> UpstreamPool:
    return fe.state.upstream


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, object]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err  # type: ignore[no-any-return]


async def read_sse(resp: httpx.Response) -> list[bytes]:
    data = b""
    async for chunk in resp.aiter_raw():
        data += chunk
    return [e for e in data.split(b"\n\n") if e]


# ---------------------------------------------------------------- happy paths


async def test_non_streaming_passes_status_and_body(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    raw = body(temperature=0.5, weird_field={"kept": [1, 2.50, "é"]})
    async with fe.client() as c:
        resp = await c.post(
            CHAT,
            content=raw,
            headers={
                "content-type": "application/json",
                "authorization": "Bearer nope",
                "x-request-id": "r1",
            },
        )
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "hello"
    seen = fake_engine.seen[-1]
    assert seen.body == raw  # byte for byte, never re-encoded
    assert seen.target == CHAT
    names = {k.lower() for k, _ in seen.headers}
    assert b"authorization" not in names
    assert (b"x-request-id", b"r1") in seen.headers
    assert (b"content-type", b"application/json") in seen.headers
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")
    assert fake_daemon.acquires == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
async def test_every_proxied_route_reaches_the_engine(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend, path: str
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    async with fe.client() as c:
        resp = await c.post(path + "?api_key=sk-secret", content=b'{"model": "m", "input": "x"}')
    assert resp.status_code == 200
    # The query string never reaches the engine (a client's ?api_key= above all).
    assert fake_engine.seen[-1].target == path
    assert fake_engine.seen[-1].body == b'{"model": "m", "input": "x"}'


async def test_streaming_is_byte_exact_with_proxy_headers(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fake_engine.chunks = 20
    fe = await start_frontend()
    async with (
        fe.client() as c,
        c.stream(
            "POST", CHAT, content=body(stream=True, stream_options={"include_usage": True})
        ) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["x-accel-buffering"] == "no"
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["content-type"].startswith("text/event-stream")
        data = b"".join([c async for c in resp.aiter_raw()])
    expected = b"".join(fake_engine.events("m"))
    assert data.startswith(expected)
    assert b'"usage"' in data
    assert data.endswith(b"data: [DONE]\n\n")
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")


async def test_models_health_metrics(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fake_daemon.add("other", state="stopped")
    fake_daemon.add("ds4-thing", served=False, backend="ds4")
    fe = await start_frontend()
    async with fe.client() as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [(m["id"], m["state"], m["object"], m["owned_by"]) for m in models["data"]] == [
            ("m", "ready", "model", "ktd"),
            ("other", "stopped", "model", "ktd"),
        ]
        assert all(isinstance(m["created"], int) for m in models["data"])
        health = await c.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        await c.post(CHAT, content=body())
        await c.post(CHAT, content=b"{bad")
        text = (await c.get("/metrics")).text
    for name in (
        'ktd_frontend_requests_total{endpoint="chat",model="m",status="200"} 1.0',
        'ktd_frontend_requests_total{endpoint="chat",model="_none",status="400"} 1.0',
        "ktd_frontend_requests_in_flight 0.0",
        "ktd_frontend_time_to_first_byte_seconds_bucket",
        'ktd_frontend_load_wait_seconds_count{model="m"} 1.0',
        "ktd_frontend_upstream_connections",
    ):
        assert name in text, name


async def test_health_503_when_daemon_down(start_frontend: StartFrontend) -> None:
    # Nobody listens on the control socket; each of ktd's answers may take 0.5 s.
    fe = await start_frontend(ping_timeout=0.5)
    async with fe.client() as c:
        with trio.fail_after(8):
            assert_openai_error(await c.get("/health"), 503)
            err = assert_openai_error(await c.post(CHAT, content=body()), 503)
            assert err["code"] == "daemon_unreachable"
            assert_openai_error(await c.get("/v1/models"), 503)


# ---------------------------------------------------------------- frontend errors


async def test_bad_requests_get_openai_errors(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend(max_body_bytes=1000)
    async with fe.client() as c:
        assert_openai_error(await c.post(CHAT, content=b"{nope"), 400)
        assert_openai_error(await c.post(CHAT, content=b'{"messages": []}'), 400)
        assert_openai_error(await c.post(CHAT, content=b'{"model": 7}'), 400)
        assert_openai_error(await c.post("/v1/completions", content=b"[]"), 400)
        # Declared too large: refused from Content-Length.
        assert_openai_error(await c.post(CHAT, content=b"x" * 5000), 413)

        # Undeclared (chunked) too large: counted while reading.
        async def gen() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"y" * 300

        assert_openai_error(await c.post(CHAT, content=gen()), 413)
        assert_openai_error(await c.get("/v1/nothing"), 404)
        assert_openai_error(await c.get(CHAT), 405)
    assert fake_daemon.acquires == 0
    assert fake_engine.seen == []


async def test_api_keys(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend(api_keys=["sk-a", "sk-b"])
    async with fe.client() as c:
        err = assert_openai_error(await c.post(CHAT, content=body()), 401)
        assert err["code"] == "missing_api_key"
        wrong = await c.post(CHAT, content=body(), headers={"authorization": "Bearer sk-c"})
        assert assert_openai_error(wrong, 401)["code"] == "invalid_api_key"
        assert "sk-c" not in wrong.text
        assert_openai_error(await c.get("/v1/models"), 401)
        ok = await c.post(CHAT, content=body(), headers={"authorization": "Bearer sk-b"})
        assert ok.status_code == 200
        # Health stays open for probes, but says nothing of the daemon without a key;
        # metrics want a key unless frontend.metrics_public.
        key = {"authorization": "Bearer sk-a"}
        assert (await c.get("/health")).json() == {"status": "ok"}
        assert "daemon" in (await c.get("/health", headers=key)).json()
        assert_openai_error(await c.get("/metrics"), 401)
        assert (await c.get("/metrics", headers=key)).status_code == 200
    public = await start_frontend(api_keys=["sk-a"], metrics_public=True)
    async with public.client() as c:
        assert "ktd_frontend_" in (await c.get("/metrics")).text
    assert fake_daemon.acquires == 1
    names = {k.lower() for k, _ in fake_engine.seen[-1].headers}
    assert b"authorization" not in names


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_404_lists_models(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend, stream: bool
) -> None:
    fake_daemon.add("deepseek-v4-kt")
    fe = await start_frontend()
    async with fe.client() as c:
        resp = await c.post(CHAT, content=body("deepseek-v4", stream=stream))
    err = assert_openai_error(resp, 404)
    assert "deepseek-v4-kt" in str(err["message"])
    assert err["param"] == "model" and err["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("code", "status"),
    [("load_failed", 503), ("timeout", 504), ("busy", 503), ("not_kt", 404), ("internal", 503)],
)
async def test_daemon_errors_map_to_statuses(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend, code: str, status: int
) -> None:
    fake_daemon.add("m", error=(code, "it broke", {"reason": "exit code 1"}))
    fe = await start_frontend()
    async with fe.client() as c:
        err = assert_openai_error(await c.post(CHAT, content=body()), status)
    if code == "load_failed":
        assert "exit code 1" in str(err["message"])


async def test_not_loaded_hint_when_autoload_off(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m")
    fe = await start_frontend(autoload=False)
    async with fe.client() as c:
        err = assert_openai_error(await c.post(CHAT, content=body()), 503)
    assert "run: ktctl load m" in str(err["message"])
    assert fake_daemon.models["m"].loads == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_error_reaches_the_client_in_the_route_s_shape(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend, stream: bool
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fake_engine.status = 400
    fe = await start_frontend()
    async with fe.client() as c:
        resp = await c.post(CHAT, content=body(stream=stream))
    # SGLang's flat {"object": "error", ...} becomes OpenAI's: the SDKs (the Node one
    # above all) read only "error"; status, message and type are the engine's.
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "message": "fake engine says no",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")


async def test_engine_down_is_503_not_500(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url="http://127.0.0.1:9", state="ready")
    fe = await start_frontend()
    async with fe.client() as c:
        err = assert_openai_error(await c.post(CHAT, content=body()), 503)
        assert err["code"] == "upstream_error"
        resp = await c.post(CHAT, content=body(stream=True))
        assert_openai_error(resp, 503)
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")


# ---------------------------------------------------------------- loads


async def _stream_releasing(fe: Frontend, loaded: trio.Event) -> bytes:
    """A streamed chat whose held load is let go once three comments have come."""
    data = b""
    async with fe.client() as c, c.stream("POST", CHAT, content=body(stream=True)) as resp:
        assert resp.status_code == 200 and not loaded.is_set()  # headers before the load
        async for chunk in resp.aiter_raw():
            data += chunk
            if data.count(b": loading m ") >= 3:
                loaded.set()
    return data


async def test_stream_waiting_for_load_gets_comments_then_data(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    # The load ends when the test says so (three comments seen), not after a delay the
    # box's load could outrun: the headers and the comments come while it is held.
    loaded = trio.Event()
    fake_daemon.add("m", url=fake_engine.url, hold=loaded)
    fe = await start_frontend()
    with trio.fail_after(30):  # no comments: the load is never let go
        data = await _stream_releasing(fe, loaded)
    events = [e for e in data.split(b"\n\n") if e]
    comments = [e for e in events if e.startswith(b": loading m ")]
    assert len(comments) >= 3, events
    data_events = [e for e in events if e.startswith(b"data: ")]
    assert data_events[-1] == b"data: [DONE]"
    assert len(data_events) == fake_engine.chunks + 1
    assert events.index(comments[-1]) < events.index(data_events[0])  # comments, then data
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")


async def test_stream_load_failure_ends_with_error_event(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", load_delay=0.8, error=("load_failed", "failed", {"reason": "CUDA OOM"}))
    fe = await start_frontend()
    async with fe.client() as c, c.stream("POST", CHAT, content=body(stream=True)) as resp:
        assert resp.status_code == 200
        events = await read_sse(resp)
    assert events[0].startswith(b": loading m")
    err = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert "CUDA OOM" in err["message"] and err["code"] == "engine_failed"
    assert events[-1] == b"data: [DONE]"
    text = (await httpx.AsyncClient(base_url=fe.url).get("/metrics")).text
    assert 'ktd_frontend_requests_total{endpoint="chat",model="m",status="503"} 1.0' in text


async def test_stream_after_load_with_engine_error_ends_with_its_error(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, load_delay=0.8)
    fake_engine.status = 400
    fe = await start_frontend()
    async with fe.client() as c, c.stream("POST", CHAT, content=body(stream=True)) as resp:
        assert resp.status_code == 200  # committed while loading
        events = await read_sse(resp)
    assert events[0].startswith(b": loading m")
    err = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert err["message"] == "fake engine says no" and err["code"] == 400
    assert events[-1] == b"data: [DONE]"
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")


async def test_shutdown_gives_claims_back_after_cut_streams(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    async with held_stream(fe, fake_engine):
        await wait_for(lambda: fake_daemon.in_flight == 1, what="reported in flight")
        fe.shutdown.set()  # graceful shutdown (graceful_timeout 1 s) cuts the stream
    await wait_for(lambda: fake_daemon.in_flight == 0, timeout=3, what="request ended")


async def test_non_stream_waits_for_load(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, load_delay=0.7)
    fe = await start_frontend()
    async with fe.client() as c:
        results = []

        async def one() -> None:
            results.append(await c.post(CHAT, content=body()))

        async with trio.open_nursery() as n:
            for _ in range(20):
                n.start_soon(one)
    assert [r.status_code for r in results] == [200] * 20
    assert fake_daemon.models["m"].loads == 1
    assert fake_daemon.acquires == 1  # one claim for all twenty
    await wait_for(lambda: fake_daemon.in_flight == 0, what="requests ended")


# ---------------------------------------------------------------- disconnects and leaks


async def test_client_abort_mid_stream_closes_upstream_and_releases(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    async with held_stream(fe, fake_engine):
        await wait_for(lambda: fake_daemon.in_flight == 1, what="reported in flight")
        t0 = trio.current_time()
        # leaving the block closes the connection mid-stream
    with trio.fail_after(1.0):
        await fake_engine.aborted_event.wait()
    assert trio.current_time() - t0 < 1.0
    await wait_for(lambda: fake_daemon.in_flight == 0, timeout=2, what="request ended")
    await wait_for(lambda: _pool(fe).counts()[0] == 0, what="no active upstream connection")
    await wait_for(lambda: fe.state.metrics.in_flight._value.get() == 0, what="in-flight 0")


async def test_client_abort_during_load_sends_nothing_upstream(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    # The load lasts until both clients have left, however slow the box.
    model = fake_daemon.add("m", url=fake_engine.url, hold=trio.Event())
    fe = await start_frontend()
    async with fe.client() as c, c.stream("POST", CHAT, content=body(stream=True)) as resp:
        async for chunk in resp.aiter_raw():
            assert chunk.startswith(b": loading m")
            break  # hang up while the model loads
    async with fe.client(timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(CHAT, content=body())
    assert model.hold is not None
    model.hold.set()
    # The load finishes after both clients left: the one claim both waited on is
    # granted to nobody in particular; it stands for no request.
    await model.loaded.wait()
    await wait_for(lambda: fake_daemon.claims != {}, what="claim granted")
    assert fake_daemon.acquires == 1
    await wait_for(lambda: fake_daemon.heartbeats > 1 and fake_daemon.in_flight == 0, what="report")
    assert fake_engine.seen == []  # nothing was sent upstream for a client that left
    await wait_for(lambda: fe.state.metrics.in_flight._value.get() == 0, what="in-flight 0")


async def test_aborted_requests_do_not_leak_pool_connections(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fake_engine.chunks = 10_000
    fake_engine.chunk_delay = 0.005
    # 40 streams, the fake daemon and the fake engine share this one process: a slow
    # box can starve the heartbeat past a short interval, and the frontend would then
    # (rightly) call the daemon gone. Leases, not liveness, are what this test is about.
    fe = await start_frontend(heartbeat_interval=5.0)
    n = 40

    async def abort_one(i: int) -> None:
        async with fe.client() as c:
            async with c.stream("POST", CHAT, content=body(stream=True)) as resp:
                assert resp.status_code == 200
                async for chunk in resp.aiter_raw():
                    # (under this load the grace may pass: then comments come first)
                    if chunk.startswith(b"data: {"):
                        break
            # a few non-streaming ones cancelled mid-wait too
            if i % 4 == 0:
                with trio.move_on_after(0.001):
                    await c.post(CHAT, content=body())

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(abort_one, i)
    await wait_for(lambda: fake_engine.active == 0, timeout=3, what="engine streams closed")
    assert fake_engine.aborted >= n, (fake_engine.aborted, fake_engine.completed)
    await wait_for(lambda: _pool(fe).counts()[0] == 0, timeout=3, what="no active conns")
    await wait_for(lambda: fake_daemon.in_flight == 0, what="requests ended")
    # And the pool still works afterwards.
    fake_engine.chunks = 3
    fake_engine.chunk_delay = 0
    async with fe.client() as c:
        assert (await c.post(CHAT, content=body())).status_code == 200


async def test_engine_death_mid_stream_ends_with_error_event(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fake_engine.chunks = 10
    fake_engine.die_after = 3
    fe = await start_frontend()
    async with fe.client() as c:
        with trio.fail_after(5):
            async with c.stream("POST", CHAT, content=body(stream=True)) as resp:
                assert resp.status_code == 200
                data = b"".join([x async for x in resp.aiter_raw()])
    events = [e for e in data.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    err = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert err["code"] == "upstream_error"
    await wait_for(lambda: fake_daemon.in_flight == 0, what="request ended")
    text = (await httpx.AsyncClient(base_url=fe.url).get("/metrics")).text
    assert 'ktd_frontend_upstream_errors_total{kind="broken",model="m"} 1.0' in text
