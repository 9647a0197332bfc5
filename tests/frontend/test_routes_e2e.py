"""Every SGLang route through real processes: ``ktd serve`` + ``ktd frontend`` + sim engines.

The official ``openai`` and ``anthropic`` SDKs are the clients where they have
the call; plain httpx for SGLang's native routes. ``ROUTE_STATUS`` records what
each route answered through the frontend (the closing report quotes it). The tests
share one daemon and frontend (``tests/stack.py``), every engine stopped before each;
the one with API keys on the frontend starts its own.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import sim_model, wait_for
from tests.stack import Stack, StackFactory

CHAT: Any = [{"role": "user", "content": "hello there"}]


def sim(alias: str, *extra_args: str, **kw: Any) -> dict[str, Any]:
    return sim_model(alias, kt={"extra_args": list(extra_args)}, **kw)


MODELS = [
    sim("m1"),
    sim("m2"),
    sim("emb", "--is-embedding"),
    sim("lo", "--enable-lora", "--lora-paths", "sql=/loras/sql"),
    sim("mx", "--enable-metrics"),
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
        return daemon_factory(cfg), frontend_factory(cfg)

    return make


def test_openai_sdk_responses_models_and_one_client_across_error_and_success(
    stack: Stack,
) -> None:
    fe = stack.frontend
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)
    try:
        # An error first (unknown model on a route the frontend used to 404) ...
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="nope", input="hi")
        # ... then successes on the same client (same keep-alive connection pool).
        resp = client.responses.create(model="m1", input="hi there", max_output_tokens=4)
        assert resp.status == "completed" and resp.output_text == "tok0 tok1 tok2 tok3"
        assert resp.usage is not None and resp.usage.output_tokens == 4
        events = list(
            client.responses.create(model="m1", input="hi", max_output_tokens=3, stream=True)
        )
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == "tok0 tok1 tok2"
        # The frontend remembers which engine made a response: no header needed.
        got = client.responses.retrieve(resp.id)
        assert got.id == resp.id and got.output_text == resp.output_text
        card = client.models.retrieve("m1")
        assert card.id == "m1"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("m1-nope")
        chat = client.chat.completions.create(model="m1", messages=CHAT, max_tokens=2)
        assert chat.choices[0].message.content == "tok0 tok1"
    finally:
        client.close()


def test_anthropic_sdk_messages_stream_and_count_tokens(stack: Stack) -> None:
    fe = stack.frontend
    client = anthropic.Anthropic(base_url=fe.url, api_key="x", max_retries=0, timeout=30)
    try:
        msg = client.messages.create(model="m1", max_tokens=3, messages=CHAT)
        assert msg.type == "message" and msg.stop_reason == "max_tokens"
        assert [b.text for b in msg.content if b.type == "text"] == ["tok0 tok1 tok2"]
        assert msg.usage.input_tokens == 2 and msg.usage.output_tokens == 3
        with client.messages.stream(model="m1", max_tokens=4, messages=CHAT) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "tok0 tok1 tok2 tok3" and final.usage.output_tokens == 4
        count = client.messages.count_tokens(model="m1", messages=CHAT)
        assert count.input_tokens == 2
        with pytest.raises(anthropic.NotFoundError):
            client.messages.create(model="nope", max_tokens=3, messages=CHAT)
    finally:
        client.close()


ROUTE_STATUS: dict[str, int] = {}


def test_every_native_route_and_the_model_rule(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        cases: list[tuple[str, dict[str, Any], Any]] = [
            (
                "/v1/score",
                {"model": "m1", "query": "q", "items": ["a"], "label_token_ids": [1]},
                "scores",
            ),
            ("/v1/tokenize", {"model": "m1", "prompt": "a b c"}, "tokens"),
            ("/v1/detokenize", {"model": "m1", "tokens": [1, 2]}, "text"),
            ("/v1/completions", {"model": "m1", "prompt": "x", "max_tokens": 2}, "choices"),
        ]
        for path, body, key in cases:
            resp = c.post(path, json=body)
            ROUTE_STATUS[path] = resp.status_code
            assert resp.status_code == 200, (path, resp.text)
            assert isinstance(resp.json(), list) if key is list else key in resp.json()
        # A generation model has no embedding routes: SGLang's own 400, passed through.
        for path, body in (
            ("/v1/rerank", {"model": "m1", "query": "q", "documents": ["a", "b"]}),
            ("/v1/classify", {"model": "m1", "input": "x"}),
            ("/v1/embeddings", {"model": "m1", "input": "x"}),
        ):
            resp = c.post(path, json=body)
            assert resp.status_code == 400, (path, resp.text)
            assert "embedding model" in resp.json()["error"]["message"], resp.text
        gen = {"text": "a b", "sampling_params": {"max_new_tokens": 3}}
        # /generate has no model field: only m1 is ready, so m1 answers.
        resp = c.post("/generate", json=gen)
        ROUTE_STATUS["/generate"] = resp.status_code
        assert resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] == 3
        # The header names the engine (and loads it).
        resp = c.post("/generate", json=gen, headers={"X-Ktd-Model": "m2"})
        assert resp.status_code == 200, resp.text
        # Two ready engines and no header: a clear 400 that says what to send.
        resp = c.post("/generate", json=gen)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert "X-Ktd-Model" in err["message"] and "m1, m2" in err["message"]
        # Back to one ready engine: no header needed again.
        assert daemon.ktctl("evict", "m2").returncode == 0
        resp = c.post("/v1/tokenize", json={"prompt": "a b"})
        assert resp.status_code == 200 and resp.json()["count"] == 2
        url = next(e for e in status(daemon) if e["alias"] == "m1")["url"]
        assert httpx.get(url + "/sim/stats").json()["requests"] >= 6
        # A stream is passed through byte for byte.
        with c.stream(
            "POST", "/generate", json={**gen, "stream": True}, headers={"X-Ktd-Model": "m1"}
        ) as s:
            raw = b"".join(s.iter_raw())
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert json.loads(events[-2][6:])["text"] == "tok0 tok1 tok2"
        # Multipart audio keeps its content type and arrives whole.
        audio = b"RIFF" + bytes(range(256)) * 40
        resp = c.post(
            "/v1/audio/transcriptions",
            data={"model": "m1"},
            files={"file": ("a.wav", audio, "audio/wav")},
        )
        ROUTE_STATUS["/v1/audio/transcriptions"] = resp.status_code
        assert resp.status_code == 200, resp.text
        assert resp.json()["text"] == f"sim heard {len(audio)} bytes of audio/wav"
        # Responses: GET by id and /cancel reach the engine that made it.
        made = c.post("/v1/responses", json={"model": "m1", "input": "x", "max_output_tokens": 1})
        ROUTE_STATUS["/v1/responses"] = made.status_code
        rid = made.json()["id"]
        got = c.get(f"/v1/responses/{rid}?api_key=leak")
        ROUTE_STATUS["GET /v1/responses/{id}"] = got.status_code
        assert got.status_code == 200 and got.json()["id"] == rid
        cancel = c.post(f"/v1/responses/{rid}/cancel")
        ROUTE_STATUS["POST /v1/responses/{id}/cancel"] = cancel.status_code
        assert cancel.status_code == 400 and "Cannot cancel" in cancel.json()["error"]["message"]
    print("route statuses through the frontend:", json.dumps(ROUTE_STATUS))


def status(daemon: Any) -> list[dict[str, Any]]:
    return list(daemon.engines().values())


def test_embedding_routes_on_an_embedding_engine(stack: Stack) -> None:
    fe = stack.frontend
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)
    try:
        emb = client.embeddings.create(model="emb", input=["alpha", "beta"])
        assert len(emb.data) == 2 and len(emb.data[0].embedding) == 64
    finally:
        client.close()
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        for path, body, key in (
            ("/v1/rerank", {"model": "emb", "query": "q", "documents": ["a", "b"]}, None),
            ("/v1/classify", {"model": "emb", "input": "x"}, "data"),
            ("/v1/score", {"model": "emb", "query": "q", "items": ["a"]}, "scores"),
        ):
            resp = c.post(path, json=body)
            ROUTE_STATUS[path] = resp.status_code
            assert resp.status_code == 200, (path, resp.text)
            assert isinstance(resp.json(), list) if key is None else key in resp.json()


def test_lora_adapter_routes_to_its_base_and_is_listed(stack: Stack) -> None:
    fe = stack.frontend
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)
    try:
        reply = client.chat.completions.create(model="lo:sql", messages=CHAT, max_tokens=1)
        assert reply.model == "lo:sql" and reply.choices[0].message.content == "tok0"
        ids = [m.id for m in client.models.list().data]
        # Every model of the config, then the adapters.
        assert ids == ["m1", "m2", "emb", "lo", "mx", "lo:sql"]
        assert client.models.retrieve("lo:sql").id == "lo:sql"
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="lo:nope", messages=CHAT, max_tokens=1)
        assert "sql" in info.value.response.json()["error"]["message"]
    finally:
        client.close()


def test_metrics_include_engine_metrics_by_alias_and_ktd_gauges(stack: Stack) -> None:
    daemon, fe = stack.daemon, stack.frontend
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        for alias in ("mx", "m2"):
            body = {"model": alias, "messages": CHAT, "max_tokens": 1}
            assert c.post("/v1/chat/completions", json=body).status_code == 200
        wait_for(lambda: all(e["in_flight"] == 0 for e in status(daemon)), what="requests ended")
        text = c.get("/metrics").text
    assert 'sglang:num_requests_total{alias="mx",model_name="mx"} 1.0' in text
    assert 'alias="m2",model_name' not in text  # m2 runs without --enable-metrics
    assert 'ktd_engine_state{alias="mx",state="ready"} 1.0' in text
    assert 'ktd_engine_state{alias="m2",state="stopped"} 0.0' in text
    assert 'ktd_engine_in_flight{alias="mx"} 0.0' in text
    assert 'ktd_engine_leases{alias="mx"} 0.0' in text  # its deprecated old name
    assert 'ktd_engine_queue_depth{alias="mx"} 0.0' in text
    assert 'ktd_engine_loads_total{alias="mx"} 1.0' in text  # no other test loads mx
    assert 'ktd_engine_evictions_total{alias="mx"} 0.0' in text
    assert 'ktd_engine_restarts_total{alias="mx"} 0.0' in text
    assert 'ktd_engine_load_seconds_count{alias="mx"} 1.0' in text
    assert text.count("# TYPE sglang:num_running_reqs gauge") == 1


def test_openai_sdk_one_http_client_across_a_401_and_a_success(own_stack: Any) -> None:
    _daemon, fe = own_stack([sim("m1")], api_keys=["sk-good"])
    http = httpx.Client(timeout=30)  # one connection pool for both clients
    bad = openai.OpenAI(base_url=fe.url + "/v1", api_key="sk-bad", max_retries=0, http_client=http)
    good = bad.with_options(api_key="sk-good")
    try:
        for _ in range(3):
            with pytest.raises(openai.AuthenticationError):
                bad.responses.create(model="m1", input="hi")
            reply = good.chat.completions.create(model="m1", messages=CHAT, max_tokens=1)
            assert reply.choices[0].message.content == "tok0"
    finally:
        http.close()
