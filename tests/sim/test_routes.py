"""The sim's wider SGLang surface, spoken to directly: shapes, errors, metrics, LoRA."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.sim.simharness import SimProc

SERVED = "sim-model"


def test_agent_native_routes_errors_metrics_and_lora(sim_factory: Callable[..., SimProc]) -> None:
    proc = sim_factory(
        env={"KTD_SIM_LOAD_TIME": "0.05"},
        served=SERVED,
        ctx=64,
        args=["--enable-metrics", "--enable-lora", "--lora-paths", "sql=/loras/sql"],
    )
    proc.wait_ready()
    with httpx.Client(base_url=proc.base, timeout=10) as c:
        # Responses: stored, retrievable, not cancellable once done; unknown id 404.
        made = c.post(
            "/v1/responses", json={"model": SERVED, "input": "a b", "max_output_tokens": 2}
        )
        obj = made.json()
        assert made.status_code == 200 and obj["object"] == "response"
        assert obj["output"][0]["content"][0]["text"] == "tok0 tok1"
        assert obj["usage"]["input_tokens"] == 2 and obj["usage"]["output_tokens"] == 2
        assert c.get(f"/v1/responses/{obj['id']}").json() == obj
        assert c.post(f"/v1/responses/{obj['id']}/cancel").status_code == 400
        missing = c.get("/v1/responses/resp_nope")
        assert missing.status_code == 404 and missing.json()["object"] == "error"
        # A Responses stream: named events, no [DONE].
        with c.stream(
            "POST",
            "/v1/responses",
            json={"model": SERVED, "input": "x", "max_output_tokens": 1, "stream": True},
        ) as s:
            raw = b"".join(s.iter_raw())
        assert raw.startswith(b"event: response.created\ndata: ")
        assert b"[DONE]" not in raw and b"event: response.completed" in raw
        # Anthropic: its own error shape; context overflow is a 400.
        bad = c.post(
            "/v1/messages",
            json={
                "model": SERVED,
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "x " * 80}],
            },
        )
        assert bad.status_code == 400
        assert bad.json()["type"] == "error" and bad.json()["error"]["type"]
        # Native: /generate without a model; tokenize/detokenize shapes.
        gen = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert gen.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
        tok = c.post("/v1/tokenize", json={"model": SERVED, "prompt": "a b c"}).json()
        assert tok["count"] == 3 and tok["max_model_len"] == 64
        # Audio without multipart: SGLang-style 400, not a crash.
        assert c.post("/v1/audio/transcriptions", json={"model": SERVED}).status_code == 400
        # LoRA: listed with its parent; base:adapter served; unknown adapter refused.
        cards = c.get("/v1/models").json()["data"]
        assert [(m["id"], m["parent"]) for m in cards] == [(SERVED, None), ("sql", SERVED)]
        ok = c.post(
            "/v1/chat/completions", json={"model": f"{SERVED}:sql", "messages": [], "max_tokens": 1}
        )
        assert ok.status_code == 200
        nope = c.post(
            "/v1/chat/completions",
            json={"model": f"{SERVED}:nope", "messages": [], "max_tokens": 1},
        )
        assert nope.status_code == 400 and "not loaded" in nope.json()["message"]
        # /metrics in SGLang's naming, counting what was served.
        text = c.get("/metrics").text
        assert f'sglang:num_running_reqs{{model_name="{SERVED}"}} 0.0' in text
        done = [ln for ln in text.splitlines() if ln.startswith("sglang:num_requests_total")]
        assert done and float(done[0].split()[-1]) >= 5
        # Tokens and time to first token as SGLang counts them (the dashboard's tokens/s).
        values = {
            ln.split("{")[0]: float(ln.split()[-1])
            for ln in text.splitlines()
            if ln.startswith(("sglang:generation_tokens_total", "sglang:prompt_tokens_total"))
            or ln.startswith("sglang:time_to_first_token_seconds_count")
        }
        assert values["sglang:generation_tokens_total"] >= 2
        assert values["sglang:prompt_tokens_total"] >= 0  # these prompts are empty
        assert values["sglang:time_to_first_token_seconds_count"] >= 2
        stats = c.get("/sim/stats").json()
        assert stats["requests"] == stats["completed"] + stats["aborted"] + stats["active"]


def test_metrics_need_enable_metrics(sim_factory: Callable[..., SimProc]) -> None:
    proc = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05"}, served=SERVED)
    proc.wait_ready()
    assert httpx.get(proc.base + "/metrics", timeout=10).status_code == 404


def test_v1_loads_as_sglang_0_5_23_and_no_get_load(sim_factory: Callable[..., SimProc]) -> None:
    """The load route SGLang really has (ktd's gateway and frontend read it); no /get_load."""
    proc = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05", "KTD_SIM_TOKEN_RATE": "20"})
    proc.wait_ready()
    with httpx.Client(base_url=proc.base, timeout=10) as c:
        assert c.get("/get_load").status_code == 404
        doc = c.get("/v1/loads").json()
        assert set(doc) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
        (load,) = doc["loads"]
        assert load["dp_rank"] == 0 and load["num_running_reqs"] == 0
        assert {"memory", "disaggregation", "queues", "num_waiting_reqs"} <= set(load)
        core = c.get("/v1/loads?include=core").json()["loads"][0]
        assert "memory" not in core and "queues" not in core and "num_used_tokens" in core
        some = c.get("/v1/loads", params={"include": "memory,queues"}).json()["loads"][0]
        assert "memory" in some and "queues" in some and "disaggregation" not in some
        assert c.get("/v1/loads?dp_rank=3").json()["loads"] == []
        bad = c.get("/v1/loads?dp_rank=x")
        assert bad.status_code == 400 and "int_parsing" in bad.json()["message"]
        assert c.get("/v1/loads?include=bogus").status_code == 500  # as the real route
        prom = c.get("/v1/loads?format=prometheus")
        assert prom.headers["content-type"].startswith("text/plain")
        assert 'sglang_num_running_reqs{dp_rank="0"} 0' in prom.text
        # A request under way is counted while it runs.
        body = {"model": SERVED, "messages": [], "max_tokens": 40, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=body) as s:
            chunks = s.iter_raw()  # kept: a dropped iterator closes the stream
            next(chunks)
            running = c.get("/v1/loads?include=core").json()["loads"][0]["num_running_reqs"]
        assert running == 1


def test_embedding_routes_need_an_embedding_model(sim_factory: Callable[..., SimProc]) -> None:
    """Measured on SGLang 0.5.23: a generation model answers these with a 400."""
    gen_model = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05"})
    emb_model = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05"}, args=["--is-embedding"])
    calls = [
        ("/v1/embeddings", {"model": SERVED, "input": "x"}),
        ("/v1/rerank", {"model": SERVED, "query": "q", "documents": ["a"]}),
        ("/v1/classify", {"model": SERVED, "input": "x"}),
    ]
    gen_model.wait_ready()
    emb_model.wait_ready()
    for path, body in calls:
        no = httpx.post(gen_model.base + path, json=body, timeout=10)
        assert no.status_code == 400, (path, no.text)
        assert "does not appear to be an embedding model" in no.json()["message"]
        assert httpx.post(emb_model.base + path, json=body, timeout=10).status_code == 200
    score = {"model": SERVED, "query": "q", "items": ["a"]}
    no = httpx.post(gen_model.base + "/v1/score", json=score, timeout=10)
    assert no.status_code == 400 and "label_token_ids is required" in no.json()["message"]
    ok = httpx.post(gen_model.base + "/v1/score", json={**score, "label_token_ids": [1, 2]})
    assert ok.status_code == 200
    assert set(ok.json()) == {
        "scores", "pooled_hidden_states", "token_logprobs", "model", "usage", "object",
    }  # fmt: skip


def test_upstream_stores_responses_only_with_the_flag(sim_factory: Callable[..., SimProc]) -> None:
    """Measured on upstream 0.5.23: no store by default; with one, cancel answers the
    finished response (the fork, the sim's default, stores always and refuses with a 400)."""
    env = {"KTD_SIM_LOAD_TIME": "0.05", "KTD_SIM_SGLANG": "upstream"}
    plain = sim_factory(env=env)
    stored = sim_factory(env=env, args=["--enable-response-store"])
    body = {"model": SERVED, "input": "a", "max_output_tokens": 1}
    plain.wait_ready()
    stored.wait_ready()
    rid = httpx.post(plain.base + "/v1/responses", json=body, timeout=10).json()["id"]
    for how in (httpx.get, httpx.post):
        path = f"/v1/responses/{rid}" + ("/cancel" if how is httpx.post else "")
        no = how(plain.base + path, timeout=10)
        assert (
            no.status_code == 400 and "Response store is disabled" in no.json()["error"]["message"]
        )
    obj = httpx.post(stored.base + "/v1/responses", json=body, timeout=10).json()
    assert httpx.get(f"{stored.base}/v1/responses/{obj['id']}", timeout=10).json() == obj
    assert httpx.post(f"{stored.base}/v1/responses/{obj['id']}/cancel", timeout=10).json() == obj
