"""Ollama's keep_alive: its durations as Ollama reads them, its empty requests, and the
official client against the real daemon, frontend and sim (``ollama stop`` included)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import ollama
import pytest

from ktd.frontend import keepalive
from tests.conftest import ConfigWriter, sim_model, wait_for

CHAT = [{"role": "user", "content": "a b"}]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (300, 300.0),
        (0, 0.0),
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        (-1, keepalive.FOREVER),
        ("-1m", keepalive.FOREVER),
    ],
)
def test_durations_read_as_ollama_reads_them(value: object, seconds: float) -> None:
    assert keepalive.duration(value) == seconds


@pytest.mark.parametrize("value", ["300", "5 minutes", "m", "", True, [1], {"a": 1}])
def test_what_ollama_refuses_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        keepalive.duration(value)


def test_empty_requests_are_loads_or_unloads() -> None:
    def read(route: str, **body: Any) -> tuple[str, float | None]:
        return keepalive.read(json.dumps({"model": "m", **body}).encode(), route)

    assert read("/api/generate") == ("load", None)
    assert read("/api/generate", keep_alive=0) == ("unload", 0.0)
    assert read("/api/generate", prompt="hi", keep_alive="1m") == ("generate", 60.0)
    assert read("/api/chat", messages=[]) == ("load", None)
    assert read("/api/chat", messages=CHAT, keep_alive=-1) == ("generate", keepalive.FOREVER)
    answer = json.loads(keepalive.answer("m", "/api/generate", "unload"))
    assert answer["done"] and answer["done_reason"] == "unload" and answer["response"] == ""


def state_of(daemon: Any, alias: str) -> str:
    return daemon.engines()[alias]["state"]  # type: ignore[no-any-return]


def test_the_official_client_loads_keeps_alive_and_stops(
    write_config: ConfigWriter, daemon_factory: Any, frontend_factory: Any
) -> None:
    cfg = write_config([sim_model("m1", kt={"ctx": 4096})])
    d = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    client = ollama.Client(host=fe.url, timeout=60)
    loaded = client.generate(model="m1")  # no prompt: Ollama's load request
    assert loaded.done and loaded.done_reason == "load" and state_of(d, "m1") == "ready"
    reply = client.chat(model="m1", messages=CHAT, keep_alive="10m", options={"num_predict": 2})
    assert reply.done

    def expiry() -> float:
        [running] = client.ps().models
        assert running.expires_at is not None
        return (running.expires_at - datetime.now(UTC)).total_seconds()

    wait_for(lambda: 500 < expiry() <= 601, what="a 10 minute keep-alive in /api/ps")
    client.chat(model="m1", messages=CHAT, keep_alive=-1, options={"num_predict": 1})
    wait_for(lambda: expiry() > 10**8, what="keep-alive for ever")
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="m1", messages=CHAT, keep_alive="soon")
    assert bad.value.status_code == 400 and "invalid duration" in bad.value.error
    stopped = client.generate(model="m1", keep_alive=0)  # what `ollama stop m1` sends
    assert stopped.done and stopped.done_reason == "unload"
    wait_for(lambda: state_of(d, "m1") == "stopped", what="the engine unloaded")
    assert client.ps().models == []
