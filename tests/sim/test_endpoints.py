"""The sim's endpoints over real HTTP: start-up order, shapes, streaming, errors, aborts."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.sim.simharness import SimProc, alive, wait_until

SERVED = "sim-model"
CTX = 512


@pytest.fixture
def sim(sim_factory: Callable[..., SimProc]) -> SimProc:
    """A fresh, ready sim: 200 tokens/s, context length 512, kt flags on the command line."""
    proc = sim_factory(
        env={"KTD_SIM_LOAD_TIME": "0.05", "KTD_SIM_TOKEN_RATE": "200"},
        served=SERVED,
        ctx=CTX,
        args=["--kt-weight-path", "/models/Sim-MoE-kt", "--kt-method", "AMXINT4"],
    )
    proc.wait_ready()
    return proc


def chat_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SERVED, "messages": [{"role": "user", "content": "hi there"}]}
    body.update(extra)
    return body


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def test_models_answers_before_health(sim_factory: Callable[..., SimProc]) -> None:
    sim = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.3", "KTD_SIM_WARMUP": "0.8"})
    refused = 0
    deadline = time.monotonic() + 15
    while True:
        assert time.monotonic() < deadline, "the sim never answered /v1/models"
        try:
            if httpx.get(sim.url("/v1/models"), timeout=2).status_code == 200:
                break
        except httpx.ConnectError:
            refused += 1  # the port is not bound during the load
        time.sleep(0.02)
    assert refused > 0
    assert httpx.get(sim.url("/health"), timeout=2).status_code == 503  # warm-up not over
    assert httpx.get(sim.url("/health_generate"), timeout=2).status_code == 503
    sim.wait_ready()
    log = sim.log()
    order = [
        "Load weight begin",
        "Load weight end",
        "Uvicorn running on http://127.0.0.1:",
        "The server is fired up and ready to roll!",
    ]
    positions = [log.index(s) for s in order]
    assert positions == sorted(positions)


def test_native_shapes(sim: SimProc) -> None:
    models = httpx.get(sim.url("/v1/models")).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert isinstance(card.pop("created"), int)
    assert card == {
        "id": SERVED,
        "object": "model",
        "owned_by": "sglang",
        "root": "/models/Sim-MoE",
        "parent": None,
        "max_model_len": CTX,
    }
    assert httpx.get(sim.url(f"/v1/models/{SERVED}")).json()["id"] == SERVED
    missing = httpx.get(sim.url("/v1/models/nope"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"

    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(sim.url(path)).json()
        assert info["model_path"] == "/models/Sim-MoE" and info["is_generation"] is True
        assert {"tokenizer_path", "weight_version", "model_type", "architectures"} <= set(info)
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(sim.url(path)).json()
        assert info["port"] == sim.port and info["context_length"] == CTX
        assert info["kt_weight_path"] == "/models/Sim-MoE-kt" and info["kt_method"] == "AMXINT4"
        assert info["served_model_name"] == SERVED and info["version"] == "0.0.0-sim"
        assert info["max_total_num_tokens"] > 0

    health = httpx.get(sim.url("/health"))
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(sim.url("/health_generate")).status_code == 200
    assert httpx.get(sim.url("/nope")).status_code == 404
    assert httpx.get(sim.url("/v1/chat/completions")).status_code == 405


def test_chat_and_completion_shapes(sim: SimProc) -> None:
    body = chat_body(model="whatever-name", max_tokens=4, some_future_field={"x": 1})
    r = httpx.post(sim.url("/v1/chat/completions"), json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    resp = r.json()
    assert resp["object"] == "chat.completion" and resp["model"] == "whatever-name"
    (choice,) = resp["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "tok0 tok1 tok2 tok3"
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    assert resp["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 6,
        "completion_tokens": 4,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    # No max_tokens: the "model" stops by itself, on EOS.
    natural = httpx.post(sim.url("/v1/chat/completions"), json=chat_body()).json()
    assert natural["choices"][0]["finish_reason"] == "stop"
    assert natural["usage"]["completion_tokens"] == 16
    # A stop string cuts the output before it.
    stopped = httpx.post(
        sim.url("/v1/chat/completions"), json=chat_body(max_tokens=8, stop=[" tok3"])
    ).json()["choices"][0]
    assert stopped["message"]["content"] == "tok0 tok1 tok2"
    assert (stopped["finish_reason"], stopped["matched_stop"]) == ("stop", " tok3")

    comp = httpx.post(
        sim.url("/v1/completions"), json={"model": SERVED, "prompt": "one two three"}
    ).json()
    assert comp["object"] == "text_completion"
    assert comp["choices"][0]["text"].split() == [f"tok{i}" for i in range(16)]
    assert comp["usage"]["prompt_tokens"] == 3 and comp["usage"]["completion_tokens"] == 16


def test_openai_client_streaming_with_usage(sim: SimProc) -> None:
    client = openai.OpenAI(base_url=sim.url("/v1"), api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": "say five words please"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok0 tok1 tok2 tok3 tok4"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 5
    assert all(c.model == SERVED for c in chunks)

    comp = client.completions.create(model=SERVED, prompt="a b", max_tokens=3)
    assert comp.choices[0].text == "tok0 tok1 tok2"
    # A generation model has no embeddings: SGLang's 400 (tests/sim/test_routes.py has
    # an --is-embedding sim serve them).
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.embeddings.create(model=SERVED, input=["alpha", "beta"])


def test_raw_sse_framing(sim: SimProc) -> None:
    body = chat_body(max_tokens=2, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", sim.url("/v1/chat/completions"), json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["transfer-encoding"] == "chunked"
        events = sse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {  # as SGLang 0.5.23 sends it
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    assert "usage" not in chunks[0]
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:3]] == ["tok0", " tok1"]
    finish = chunks[3]["choices"][0]
    assert finish["delta"] == {"reasoning_content": None} and finish["finish_reason"] == "length"
    assert "matched_stop" in finish
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["total_tokens"] == 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_sglang_error_shapes(sim: SimProc) -> None:
    url = sim.url("/v1/chat/completions")
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    err = bad.json()
    assert err["object"] == "error" and err["code"] == 400 and err["type"] == "Bad Request"
    assert set(err) == {"object", "message", "type", "param", "code"}

    wrong_type = httpx.post(url, content=b"{}", headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 400

    for stream in (False, True):
        lora = httpx.post(url, json=chat_body(model=f"{SERVED}:adapter", stream=stream))
        assert lora.status_code == 400
        assert lora.json()["type"] == "BadRequestError" and "LoRA" in lora.json()["message"]

    long_prompt = " ".join(["word"] * (CTX + 10))
    too_long = chat_body(messages=[{"role": "user", "content": long_prompt}])
    r = httpx.post(url, json=too_long)
    assert r.status_code == 400
    assert r.json()["message"] == (
        f"The input ({CTX + 10} tokens) is longer than the model's context length ({CTX} tokens)."
    )
    assert r.json()["type"] == "BadRequestError"

    # Streaming or not, the real server answers a plain JSON 400, not an SSE error event
    # (measured on sglang 0.5.23: tests/real/README.md).
    streamed = httpx.post(url, json={**too_long, "stream": True})
    assert streamed.status_code == 400
    assert streamed.headers["content-type"] == "application/json"
    assert streamed.json() == r.json()


def test_abort_is_counted_and_logged(sim: SimProc) -> None:
    before = httpx.get(sim.url("/sim/stats")).json()
    assert set(before) == {"requests", "active", "completed", "aborted", "streams"}
    body = chat_body(max_tokens=400, stream=True)  # 2 s at 200 tokens/s
    with httpx.stream("POST", sim.url("/v1/chat/completions"), json=body) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    t0 = time.monotonic()

    def counted() -> bool:
        s = httpx.get(sim.url("/sim/stats")).json()
        return bool(s["aborted"] == before["aborted"] + 1 and s["active"] == 0)

    wait_until(counted, 2, "the aborted stream in /sim/stats")
    assert time.monotonic() - t0 < 1.0  # promptly, long before the stream would have ended
    after = httpx.get(sim.url("/sim/stats")).json()
    assert after["streams"] == before["streams"] + 1
    assert after["requests"] == after["active"] + after["completed"] + after["aborted"]
    sim.wait_log("aborted by client", timeout=2)


def test_sigusr1_toggles_hang(sim: SimProc) -> None:
    os.kill(sim.pid, signal.SIGUSR1)
    sim.wait_log("SIGUSR1: requests hang", timeout=2)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(sim.url("/health"), timeout=0.5)
    os.kill(sim.pid, signal.SIGUSR1)
    sim.wait_log("SIGUSR1: requests are answered again", timeout=2)
    assert httpx.get(sim.url("/health"), timeout=2).status_code == 200


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_scheduler_child_and_idle_cpu(sim: SimProc) -> None:
    child = sim.record()["scheduler_pid"]
    assert alive(child)
    with open(f"/proc/{child}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    assert int(status["PPid"]) == sim.pid
    assert status["Name"].strip() == "sglang::schedul"
    time.sleep(0.3)  # let the last test's connections go quiet
    before = _cpu_ticks(sim.pid) + _cpu_ticks(child)
    time.sleep(1.0)
    assert _cpu_ticks(sim.pid) + _cpu_ticks(child) - before <= 2  # 1 tick = 10 ms


def _raw(sim: SimProc, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", sim.port), timeout=3) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_http_edge_cases(sim: SimProc) -> None:
    assert _raw(sim, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
    two = _raw(
        sim,
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /sim/stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    assert two.count(b"HTTP/1.1 200 OK") == 2 and two.endswith(b'"streams":0}')
    body = json.dumps({"prompt": "x", "max_tokens": 2, "stream": True}).encode()
    old = _raw(
        sim,
        b"POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert old.endswith(b"data: [DONE]\n\n") and b"transfer-encoding" not in old.lower()
    with httpx.Client(base_url=sim.base) as client:  # keep-alive: one connection, many requests
        for _ in range(3):
            assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert httpx.get(sim.url("/health")).status_code == 200


def test_the_hold_gate_keeps_streams_after_their_first_token_until_opened(
    sim_factory: Callable[..., SimProc],
) -> None:
    """``KTD_SIM_HOLD``: the harness's stream that outlives what races it (the sim's own
    ``/sim/gate``, not SGLang's): the first token goes out, the next wait for the gate;
    ``/health`` (one token) and one-token requests are never held."""
    from tests.sim.test_memory import in_background

    sim = sim_factory(env={"KTD_SIM_LOAD_TIME": "0.05", "KTD_SIM_HOLD": "1"}, served=SERVED)
    sim.wait_ready()
    seen: list[str] = []

    def stream() -> httpx.Response:
        body = chat_body(max_tokens=5, stream=True)
        with httpx.stream("POST", sim.url("/v1/chat/completions"), json=body, timeout=60) as r:
            seen.extend(line for line in r.iter_lines() if line)
            return r

    answer = in_background(stream)
    wait_until(lambda: any('"content":"' in x and '"content":""' not in x for x in seen), 10, "1st")
    assert httpx.get(sim.url("/health"), timeout=5).status_code == 200
    one = httpx.post(sim.url("/v1/chat/completions"), json=chat_body(max_tokens=1), timeout=5)
    assert one.status_code == 200
    assert not answer.done() and httpx.get(sim.url("/sim/stats")).json()["active"] == 1
    bad = httpx.post(sim.url("/sim/gate"), json={"open": "yes"}, timeout=5)
    assert bad.status_code == 400
    assert httpx.post(sim.url("/sim/gate"), json={"open": True}, timeout=5).json() == {"open": True}
    assert answer.result(timeout=30).status_code == 200 and seen[-1] == "data: [DONE]"
    assert sum('"content":"' in x and '"content":""' not in x for x in seen) == 5
