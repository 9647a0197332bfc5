"""Ollama's API through real processes: ``ktd serve`` + ``ktd frontend`` + sim engines.

The official ``ollama`` client (PyPI) is the client; plain httpx where it has no
call (``/api/version``, ``/``, raw NDJSON). Chat and generate go through the same
routing, on-demand load, claims and admission as the OpenAI routes.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import ollama
import pytest

from tests.conftest import sim_model, wait_for

CHAT = [{"role": "user", "content": "a b"}]


def sim(alias: str, **kw: Any) -> dict[str, Any]:
    # Room for SGLang's default Ollama budget of 2048 new tokens (it must fit the context).
    kt = {"ctx": 4096, **kw.pop("kt", {})}
    return sim_model(alias, kt=kt, **kw)


def state_of(daemon: Any, alias: str) -> str:
    out = json.loads(daemon.ktctl("status", "--json").stdout)
    return next(e["state"] for e in out["engines"] if e["alias"] == alias)  # type: ignore[no-any-return]


def test_official_client_lists_loads_on_demand_streams_and_refuses_clearly(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    cfg = write_config([sim("m1"), sim("m2", ttl=600)])
    daemon = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    client = ollama.Client(host=fe.url, timeout=60)

    # Every configured model, as Ollama lists installed ones; nothing is running yet.
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"m1:latest", "m2:latest"}
    m1 = listed["m1:latest"]
    est = json.loads(daemon.ktctl("load", "--estimate", "--json", "m1").stdout)["estimate"]
    assert m1.size == est["host_bytes"] + est["gpu_weights_bytes"] > 0  # ktctl's estimate
    assert m1.digest is not None and m1.digest.startswith("sha256:") and len(m1.digest) == 71
    assert m1.details is not None and m1.details.format == "sglang"
    assert client.ps().models == []
    # /api/show of a model that is not loaded: described from the config, not loaded.
    shown = client.show("m1:latest")
    assert shown.modelfile == "FROM m1:latest\nPARAMETER num_ctx 4096\n"
    assert state_of(daemon, "m1") == "stopped"

    # Chat loads m1 on demand; `name:latest` is `name`.
    chat = client.chat(model="m1:latest", messages=CHAT, options={"num_predict": 3})
    assert chat.message.content == "tok0 tok1 tok2" and chat.done
    parts = list(client.chat(model="m1", messages=CHAT, options={"num_predict": 3}, stream=True))
    assert "".join(p.message.content or "" for p in parts) == "tok0 tok1"  # SGLang's stream
    assert parts[-1].done and parts[-1].done_reason == "stop"
    gen = client.generate(model="m1:latest", prompt="x", options={"num_predict": 2})
    assert gen.response == "tok0 tok1"
    streamed = list(client.generate(model="m1", prompt="x", stream=True))
    assert streamed[-1].done and len(streamed) == 16  # no num_predict: the sim stops itself

    # Ready now: /api/show is the engine's own; /api/ps lists it, Ollama's "Forever".
    assert client.show("m1").modelfile == "FROM m1\nPARAMETER num_ctx 4096\n"
    (running,) = client.ps().models
    assert running.model == "m1:latest" and running.context_length == 4096
    assert running.size == est["host_bytes"] + est["gpu_bytes"]
    assert running.size_vram == est["gpu_bytes"]
    assert running.expires_at is not None and running.expires_at.year > 2200
    # m2 has a 600 s TTL: it expires about then.
    assert client.chat(model="m2", messages=CHAT, options={"num_predict": 1}).done
    by_name = {m.model: m for m in client.ps().models}
    left = by_name["m2:latest"].expires_at
    assert left is not None
    assert 500 < (left - datetime.now(UTC)).total_seconds() <= 601
    assert [m.model for m in client.ps().models] == ["m1:latest", "m2:latest"]  # longest first

    # What ktd cannot do, and what does not exist, in Ollama's words.
    for call, status, words in (
        (lambda: client.chat(model="nope", messages=CHAT), 404, "`nope` does not exist"),
        (lambda: client.chat(model="m1:sql", messages=CHAT), 404, "no LoRA adapter"),
        (lambda: client.pull("llama3"), 501, "does not pull"),
        (lambda: client.delete("m1"), 501, "does not delete"),
        (lambda: client.copy("m1", "m3"), 501, "does not copy"),
        (lambda: client.embed(model="m1", input="x"), 501, "/v1/embeddings"),
        (lambda: client.show("nope"), 404, "model 'nope' not found"),
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == status, caught.value
        assert words in caught.value.error, caught.value.error
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        assert c.get("/api/version").json() == {"version": "0.1.0"}
        root = c.get("/")
        assert root.text == "Ollama is running" and root.headers["content-type"].startswith(
            "text/plain"
        )
        assert c.head("/").status_code == 200
        bad = c.post("/api/chat", content=b"{nope", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and set(bad.json()) == {"error"}
        plain = c.post(
            "/api/chat", content=b'{"model":"m1"}', headers={"content-type": "text/plain"}
        )
        assert plain.status_code == 415 and set(plain.json()) == {"error"}  # Ollama's shape
        wrong = c.get("/api/chat")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert c.get("/api/nothing").json() == {"error": "Unknown Ollama route: GET /api/nothing"}


def test_ollama_streams_wait_for_a_load_and_share_admission(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    """A stream for an engine that is loading gets no 200 until it is ready (no comment
    line would be valid NDJSON); the model's admission limits apply to Ollama's routes too."""
    # Each stream is held after its first token until the gate opens: it keeps the one
    # slot however long the 429 below takes.
    slow = {"KTD_SIM_LOAD_TIME": "1.0", "KTD_SIM_HOLD": "1"}
    cfg = write_config([sim("m1", env=slow, max_concurrent=1, max_queue=0)])
    daemon = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    body = {"model": "m1:latest", "messages": CHAT, "options": {"num_predict": 40}}
    with httpx.Client(base_url=fe.url, timeout=60) as c:
        t0 = time.monotonic()
        with c.stream("POST", "/api/chat", json=body) as s:
            assert s.status_code == 200
            assert s.headers["content-type"] == "application/x-ndjson"
            assert time.monotonic() - t0 >= 1.0  # the status waited for the load
            lines = s.iter_lines()
            first = json.loads(next(lines))
            assert first["message"]["content"] == "tok0" and first["done"] is False
            # The one slot is taken and nobody may wait: Ollama-shaped 429.
            full = c.post("/api/generate", json={"model": "m1", "prompt": "x"})
            assert full.status_code == 429 and "max_queue" in full.json()["error"]
            assert "retry-after" in full.headers
            port = daemon.engines()["m1"]["port"]
            httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}).raise_for_status()
            rest = [json.loads(line) for line in lines]
        assert rest[-1]["done"] is True and len(rest) == 39


def test_v1_loads_is_proxied_and_get_load_sums_it(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    # SGLang counts the daemon's health probe (it generates a token) in /v1/loads like
    # any request, so the probes wait an hour here: every count below is exact.
    cfg = write_config(
        [sim("m1", env={"KTD_SIM_TOKEN_RATE": "20"}), sim("m2")],
        daemon={"health_interval": 3600},
    )
    daemon = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    assert daemon.ktctl("load", "m1").returncode == 0
    with httpx.Client(base_url=fe.url, timeout=30) as c:
        # Routed like the other model-less routes: the only ready engine answers.
        doc = c.get("/v1/loads").json()
        assert doc["version"] == "0.0.0-sim" and doc["loads"][0]["dp_rank"] == 0
        # Its own query parameters reach the engine, nothing else does.
        core = c.get("/v1/loads", params={"include": "core", "api_key": "k"}).json()
        assert "memory" not in core["loads"][0]
        assert c.post("/v1/loads").status_code == 405
        # X-Ktd-Model picks (and loads) another engine.
        assert c.get("/v1/loads", headers={"X-Ktd-Model": "m2"}).status_code == 200
        gone = c.get("/v1/loads")
        assert gone.status_code == 400 and "X-Ktd-Model" in gone.json()["error"]["message"]
        # sglang-router's /get_load is the engines' /v1/loads, summed.
        assert c.get("/get_load").json() == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        ]
        chat = {"model": "m1", "messages": [], "max_tokens": 40, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=chat) as s:
            chunks = s.iter_raw()
            next(chunks)
            busy = c.get("/get_load").json()
            ready = json.loads(daemon.ktctl("status", "--json").stdout)["engines"]
        assert busy[0]["num_reqs"] == 1, (busy, ready)
    url = next(e["url"] for e in ready if e["alias"] == "m1")
    wait_for(lambda: httpx.get(url + "/sim/stats").json()["active"] == 0, 10, "stream ended")


def test_an_engine_dying_mid_stream_ends_the_ndjson_with_an_error_line(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    env = {"KTD_SIM_CRASH_MID_STREAM": "3", "KTD_SIM_TOKEN_RATE": "50"}
    cfg = write_config([sim("m1", env=env)])
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    client = ollama.Client(host=fe.url, timeout=60)
    got = []
    with pytest.raises(ollama.ResponseError) as caught:
        for part in client.chat(model="m1", messages=CHAT, stream=True):
            got.append(part.message.content)
    assert got == ["tok0", " tok1", " tok2"]  # passed through as the engine sent them
    assert "failed while answering" in caught.value.error
    with httpx.Client(base_url=fe.url, timeout=60) as c:  # the raw bytes: one line each
        raw = c.post("/api/generate", json={"model": "m1", "prompt": "x"}).content
    *lines, last = raw.decode().splitlines()
    assert [json.loads(x)["done"] for x in lines] == [False] * len(lines)
    assert set(json.loads(last)) == {"error"}
