"""The real thing: ``ktd serve`` + ``ktd frontend`` processes + sim engines.

OpenAI's own client talks to the frontend; the sim's ``/sim/stats`` and
``ktctl status --json`` tell what really happened behind it. The tests share one
daemon and frontend (``tests/stack.py``), each on a model of its own, all of them
stopped before each test; the two that need a frontend config of their own or kill
the daemon start their own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from ktd.daemon.engine import proctree
from tests.conftest import MARK, SHARED
from tests.frontend.frontend_helpers import sim_entry
from tests.stack import Stack, StackFactory

CHAT: Any = [{"role": "user", "content": "hello"}]


def status(daemon: Any) -> dict[str, Any]:
    return {"engines": list(daemon.engines().values())}


def engine(daemon: Any, alias: str) -> dict[str, Any]:
    for e in status(daemon)["engines"]:
        if e["alias"] == alias:
            return e  # type: ignore[no-any-return]
    raise AssertionError(f"no engine {alias}")


def wait_until(pred: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out: {what}")


def sim_stats(url: str) -> dict[str, int]:
    return httpx.get(url + "/sim/stats", timeout=5).json()  # type: ignore[no-any-return]


MODELS = [
    sim_entry("m1"),
    sim_entry("slow", KTD_SIM_LOAD_TIME=1.5),
    sim_entry("deepseek-v4-kt"),
    sim_entry("paced", KTD_SIM_TOKEN_RATE=20),
    sim_entry("crashy", KTD_SIM_CRASH_MID_STREAM=3, KTD_SIM_TOKEN_RATE=50),
    sim_entry("eta", KTD_SIM_LOAD_TIME=0.5),
]


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    return stack_factory(MODELS)


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


@pytest.fixture
def own_stack(write_config: Any, daemon_factory: Any, frontend_factory: Any) -> Any:
    def make(models: list[dict[str, Any]], **frontend: Any) -> tuple[Any, Any]:
        cfg = write_config(models, frontend=frontend)
        daemon = daemon_factory(cfg)
        fe = frontend_factory(cfg)
        return daemon, fe

    return make


def test_openai_client_sync(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
    try:
        models = client.models.list()
        assert [m.id for m in models.data] == [m["alias"] for m in MODELS]
        # The model is not loaded: this first request loads it on demand.
        reply = client.chat.completions.create(model="m1", messages=CHAT, max_tokens=5)
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        chunks = list(
            client.chat.completions.create(
                model="m1",
                messages=CHAT,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 4
        comp = client.completions.create(model="m1", prompt="hi", max_tokens=3)
        assert comp.choices[0].text
        streamed = list(
            client.completions.create(model="m1", prompt="hi", max_tokens=3, stream=True)
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices)
    finally:
        client.close()
    wait_until(lambda: engine(daemon, "m1")["in_flight"] == 0, what="leases back to 0")


async def test_openai_client_async(stack: Stack) -> None:
    fe = stack.frontend
    client = openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
    try:
        reply = await client.chat.completions.create(model="m1", messages=CHAT, max_tokens=3)
        assert reply.choices[0].message.content
        stream = await client.chat.completions.create(
            model="m1",
            messages=CHAT,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
        comp = await client.completions.create(model="m1", prompt="x", max_tokens=2)
        assert comp.choices[0].text
        comp_stream = await client.completions.create(
            model="m1", prompt="x", max_tokens=2, stream=True
        )
        assert [c async for c in comp_stream]
    finally:
        await client.close()


def test_concurrent_requests_for_unloaded_model_cause_one_load(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    assert engine_state(daemon, "slow") in ("stopped", None)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=fe.url, timeout=60) as c:
            codes: list[int] = []

            async def one(i: int) -> None:
                body = {"model": "slow", "messages": CHAT, "max_tokens": 2, "stream": i % 2 == 0}
                resp = await c.post("/v1/chat/completions", json=body)
                codes.append(resp.status_code)

            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(one, i)
            return codes

    codes = trio.run(burst)
    assert codes == [200] * 20
    eng = engine(daemon, "slow")
    assert eng["state"] == "ready" and eng["restarts"] == 0
    stats = sim_stats(eng["url"])
    assert stats["requests"] == 20
    launches = [
        pid
        for pid in proctree.all_procs()
        if "sglang.launch_server" in " ".join(proctree.cmdline(pid))
        and "slow" in proctree.cmdline(pid)
        # This module's processes only: other runs on the machine may serve a "slow" too.
        and proctree.environ_has(pid, MARK, SHARED)
    ]
    assert len(launches) == 1, launches
    wait_until(lambda: engine(daemon, "slow")["in_flight"] == 0, what="leases back to 0")


def engine_state(daemon: Any, alias: str) -> str | None:
    for e in status(daemon)["engines"]:
        if e["alias"] == alias:
            return str(e["state"])
    return None


def test_family_name_does_not_route(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="deepseek-v4", messages=CHAT)
    finally:
        client.close()
    assert info.value.status_code == 404
    err = info.value.response.json()["error"]
    assert "deepseek-v4-kt" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert engine_state(daemon, "deepseek-v4-kt") in ("stopped", None)


def test_abort_stream_closes_upstream_and_ends_the_request(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    body = {"model": "paced", "messages": CHAT, "max_tokens": 2000, "stream": True}
    with (
        httpx.Client(base_url=fe.url, timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        seen = 0
        # Keep a reference: a sync generator dropped at ``break`` is closed at
        # once, which would close the connection before we look.
        chunks = resp.iter_raw()
        for chunk in chunks:
            if chunk.startswith(b"data: {"):
                seen += 1
            if seen >= 3:
                break
        url = engine(daemon, "paced")["url"]
        # The frontend's report of its claim: one request in flight.
        wait_until(lambda: engine(daemon, "paced")["in_flight"] == 1, what="in flight reported")
        assert sim_stats(url)["active"] == 1
        t0 = time.monotonic()
        resp.close()  # hang up mid-stream
    wait_until(lambda: sim_stats(url)["aborted"] == 1, timeout=1.0, what="sim saw the abort")
    assert time.monotonic() - t0 < 1.0
    wait_until(lambda: engine(daemon, "paced")["in_flight"] == 0, timeout=3, what="request ended")
    assert sim_stats(url)["active"] == 0


def test_abort_while_loading_leaves_nothing_in_flight(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    body = {"model": "slow", "messages": CHAT, "max_tokens": 5, "stream": True}
    with (
        httpx.Client(base_url=fe.url, timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        first = next(resp.iter_raw())
        assert first.startswith(b": loading slow")

    # The load goes on (other clients may want it); nothing stays in flight.
    daemon.wait_state("slow", "ready", timeout=20)
    daemon.wait_engine("slow", lambda e: e["in_flight"] == 0, timeout=3, what="none in flight")
    assert sim_stats(engine(daemon, "slow")["url"])["requests"] == 0


def test_engine_crash_mid_stream_ends_stream_with_error(stack: Stack) -> None:
    fe = stack.frontend
    body = {"model": "crashy", "messages": CHAT, "max_tokens": 200, "stream": True}
    t0 = time.monotonic()
    with (
        httpx.Client(base_url=fe.url, timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        data = b"".join(resp.iter_raw())

    assert time.monotonic() - t0 < 15
    events = [e for e in data.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]"
    err = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert err["message"] and err["code"]


def test_frontend_errors_over_real_http(own_stack: Any) -> None:
    daemon, fe = own_stack([sim_entry("m1")], api_keys=["sk-test"], max_body_bytes=4096)
    ok = {"authorization": "Bearer sk-test", "content-type": "application/json"}
    plain = {**ok, "content-type": "text/plain"}  # what a cross-site page may send
    with httpx.Client(base_url=fe.url, timeout=10) as c:
        cases = [
            (c.post("/v1/chat/completions", content=b"{bad", headers=ok), 400),
            (c.post("/v1/chat/completions", content=b'{"model":"m1"}', headers=plain), 415),
            (c.post("/v1/chat/completions", json={"messages": []}, headers=ok), 400),
            (c.post("/v1/chat/completions", json={"model": "m1"}), 401),
            (
                c.post(
                    "/v1/chat/completions",
                    json={"model": "m1"},
                    headers={"authorization": "Bearer sk-wrong"},
                ),
                401,
            ),
            (c.post("/v1/completions", content=b"x" * 10000, headers=ok), 413),
            (c.post("/v1/embeddings", json={"model": "nope", "input": "x"}, headers=ok), 404),
        ]
        for resp, code in cases:
            assert resp.status_code == code, resp.text
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert engine_state(daemon, "m1") in ("stopped", None)


def test_daemon_restart_is_survived(own_stack: Any, tmp_path: Path) -> None:
    daemon, fe = own_stack([sim_entry("m1")])
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        daemon.stop()
        wait_until(lambda: c.get("/health").status_code == 503, what="health 503")
        resp = c.post("/v1/chat/completions", json={"model": "m1", "messages": CHAT})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "daemon_unreachable"
        daemon.start()
        wait_until(lambda: c.get("/health").status_code == 200, what="health 200")
        resp = c.post("/v1/chat/completions", json={"model": "m1", "messages": CHAT})
        assert resp.status_code == 200, resp.text


def test_loading_comments_show_elapsed_and_expected_time(stack: Stack) -> None:
    """After one load, ktd knows how long ``eta`` takes: a stream waiting for the next
    load is told elapsed and expected time in its ``: loading`` comments."""
    daemon, fe = stack.daemon, stack.frontend
    with daemon.client(timeout=60) as c:
        c.load("eta")
        c.evict("eta")
        [e] = c.status("eta")
    assert e.load_eta and e.load_eta >= 0.5
    body = {"model": "eta", "messages": CHAT, "max_tokens": 2, "stream": True}
    with (
        httpx.Client(base_url=fe.url, timeout=30) as hc,
        hc.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        first = next(resp.iter_raw())
    assert first.startswith(b": loading eta ") and b"s of ~" in first and b"s expected" in first
