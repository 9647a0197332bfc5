"""Named keys through the real daemon, frontend and sim, with the official clients.

A key's scope (403 in each API's own shape, and its model lists), its share
(``max_concurrent``: 429 with ``Retry-After``), its day (``tokens_per_day``: 429 once
the tokens the engine reported reach it, counted from a stream whose usage chunk ktd
asked for and the client never saw). The tests share one daemon and frontend
(``tests/stack.py``): each spends only what the others do not check (the frugal key's
day is spent by one test alone).
"""

from __future__ import annotations

import threading

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import sim_model
from tests.stack import Stack, StackFactory

SCOPED = "sk-scoped-only-m1"
CAPPED = "sk-capped-one-at-a-time"
FRUGAL = "sk-frugal-few-tokens"
KEYS = [
    {"name": "scoped", "key": SCOPED, "models": ["m1"]},
    {"name": "capped", "key": CAPPED, "max_concurrent": 1},
    {"name": "frugal", "key": FRUGAL, "tokens_per_day": 20},
]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    models = [sim_model(m, env={"KTD_SIM_TOKEN_RATE": 40}) for m in ("m1", "m2")]
    # Its streams wait after their first token until the test opens the sim's gate.
    models.append(sim_model("held", env={"KTD_SIM_HOLD": 1}))
    return stack_factory(models, frontend={"keys": KEYS})


@pytest.fixture
def stack(shared: Stack) -> str:
    return shared.reset().url


def oai(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_a_scoped_key_sees_and_uses_its_models_only_in_every_api(stack: str) -> None:
    client = oai(stack, SCOPED)
    assert [m.id for m in client.models.list()] == ["m1"]
    assert client.chat.completions.create(model="m1", messages=HI, max_tokens=2).choices
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model="m2", messages=HI, max_tokens=2)
    assert "may not use the model `m2`" in str(denied.value)
    claude = anthropic.Anthropic(base_url=stack, api_key=SCOPED, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        claude.messages.create(model="m2", max_tokens=2, messages=HI)  # type: ignore[arg-type]
    llama = ollama.Client(host=stack, headers={"authorization": f"Bearer {SCOPED}"})
    assert [m.model for m in llama.list().models] == ["m1:latest"]
    with pytest.raises(ollama.ResponseError) as refused:
        llama.chat(model="m2", messages=HI)
    assert refused.value.status_code == 403
    # Every other key sees them all.
    assert sorted(m.id for m in oai(stack, CAPPED).models.list()) == ["held", "m1", "m2"]


def test_a_key_past_max_concurrent_gets_429_while_its_stream_runs(
    stack: str, shared: Stack
) -> None:
    client = oai(stack, CAPPED)
    started = threading.Event()
    done: list[str] = []

    def long_stream() -> None:
        chat = client.chat.completions
        stream = chat.create(model="held", messages=HI, max_tokens=8, stream=True)
        for chunk in stream:
            started.set()
            done.append(chunk.id)

    worker = threading.Thread(target=long_stream)
    worker.start()
    try:
        assert started.wait(30)
        with httpx.Client(timeout=30) as c:
            busy = c.post(
                stack + "/v1/chat/completions",
                headers={"authorization": f"Bearer {CAPPED}"},
                json={"model": "m2", "messages": HI, "max_tokens": 2},
            )
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "key_concurrency"
        # Another key is not held back by it.
        assert oai(stack, SCOPED).chat.completions.create(model="m1", messages=HI, max_tokens=2)
    finally:
        port = shared.daemon.engines()["held"]["port"]
        httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}, timeout=30)
        worker.join(60)
    assert done
    assert client.chat.completions.create(model="m1", messages=HI, max_tokens=2).choices


def test_a_key_s_tokens_for_the_day_are_the_engine_s_own_count(stack: str) -> None:
    client = oai(stack, FRUGAL)
    chunks = list(
        client.chat.completions.create(model="m1", messages=HI, max_tokens=30, stream=True)
    )
    assert chunks and all(c.usage is None for c in chunks)  # ktd asked; the client never saw it
    with pytest.raises(openai.RateLimitError) as spent:
        client.chat.completions.create(model="m1", messages=HI, max_tokens=2)
    assert "tokens_per_day" in str(spent.value) and "resets at" in str(spent.value)
    retry = int(spent.value.response.headers["retry-after"])
    assert 0 < retry <= 86400
    # A client that asks for the usage itself sees it (another key: this one is spent).
    shown = list(
        oai(stack, CAPPED).chat.completions.create(
            model="m1",
            messages=HI,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert shown[-1].usage is not None and shown[-1].usage.completion_tokens == 5
