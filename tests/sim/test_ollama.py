"""Ollama's API on the sim, as SGLang 0.5.23 serves it, spoken to by the official client."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import httpx
import ollama
import pytest

from tests.sim.simharness import SimProc

SERVED = "sim-model"
CTX = 2100  # room for SGLang's default Ollama budget (2048 new tokens) and a short prompt


@pytest.fixture
def sim(sim_factory: Callable[..., SimProc]) -> SimProc:
    proc = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05"}, served=SERVED, ctx=CTX)
    proc.wait_ready()
    return proc


def test_official_client_chat_generate_list_show(sim: SimProc) -> None:
    client = ollama.Client(host=sim.base, timeout=10)
    msgs = [{"role": "user", "content": "a b"}]
    chat = client.chat(model=SERVED, messages=msgs, options={"num_predict": 3})
    assert chat.message.content == "tok0 tok1 tok2" and chat.done
    assert chat.prompt_eval_count == 2 and chat.eval_count == 3
    parts = list(client.chat(model=SERVED, messages=msgs, options={"num_predict": 3}, stream=True))
    # SGLang's stream drops the last token's text into its empty done line.
    assert "".join(p.message.content or "" for p in parts) == "tok0 tok1"
    assert [p.done for p in parts] == [False, False, True] and parts[-1].done_reason == "stop"
    gen = client.generate(model=SERVED, prompt="x", options={"num_predict": 2})
    assert gen.response == "tok0 tok1" and gen.eval_count == 2
    assert client.generate(model=SERVED, prompt="").response == ""  # the CLI's "load"
    # No num_predict: SGLang's 2048 budget; the "model" stops on its own first.
    assert client.generate(model=SERVED, prompt="x").eval_count == 16
    (listed,) = client.list().models
    assert listed.model == SERVED and listed.size == 0
    shown = client.show(f"{SERVED}:latest")
    assert shown.modelfile == f"FROM {SERVED}:latest\nPARAMETER num_ctx {CTX}\n"
    assert shown.capabilities == ["completion"]


def test_defaults_errors_and_root(sim: SimProc) -> None:
    with httpx.Client(base_url=sim.base, timeout=10) as c:
        # stream defaults to true; pydantic reads "yes" as true and null is a 400.
        body = {"model": SERVED, "messages": [{"role": "user", "content": "x"}]}
        for stream in (None, "yes", 1):
            extra = {} if stream is None else {"stream": stream}
            r = c.post("/api/chat", json={**body, **extra, "options": {"num_predict": 2}})
            assert r.headers["content-type"] == "application/x-ndjson", stream
            lines = [json.loads(x) for x in r.text.splitlines()]
            assert lines[-1]["done"] is True and set(lines[-1]) == {
                "model", "created_at", "message", "done", "done_reason",
            }  # fmt: skip
        assert c.post("/api/chat", json={**body, "stream": None}).status_code == 400
        missing = c.post("/api/chat", json={"model": SERVED})
        assert missing.status_code == 400 and "'messages'" in missing.json()["message"]
        no_content = c.post("/api/chat", json={"model": SERVED, "messages": [{"role": "user"}]})
        assert "('body', 'messages', 0, 'content')" in no_content.json()["message"]
        form = c.post(
            "/api/show", content=b'{"model": "x"}', headers={"content-type": "text/plain"}
        )
        assert form.status_code == 400 and "model_attributes_type" in form.text
        # Over the context: SGLang's uncaught ValueError, a bare 500 ...
        long = {"model": SERVED, "prompt": "w " * 2200, "stream": False}
        r = c.post("/api/generate", json=long)
        assert (r.status_code, r.text) == (500, "Internal Server Error")
        # ... also when only the default budget of 2048 new tokens does not fit.
        budget = {"model": SERVED, "prompt": "w " * 60, "stream": False}
        assert c.post("/api/generate", json=budget).status_code == 500
        fits = {**budget, "options": {"num_predict": 8}}
        assert c.post("/api/generate", json=fits).json()["eval_count"] == 8
        root = c.get("/")
        assert root.json() == "SGLang is running"
        head = c.head("/")
        assert head.status_code == 200 and head.content == b""
        assert c.get("/").status_code == 200  # the connection is still fine after a HEAD
    # ... and streaming, a 200 whose chunked body is cut (no last chunk).
    data = json.dumps({**long, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", sim.port), timeout=10) as s:
        s.sendall(
            b"POST /api/generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(data), data)
        )
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 ") and b"application/x-ndjson" in got
    assert not got.endswith(b"0\r\n\r\n")
