"""What a waiting stream is sent, per API, and what a request's headers ask for
(``ktd.frontend.waits``; the board itself: ``tests/core/test_waiting.py``)."""

from __future__ import annotations

import json

from ktd import protocol as p
from ktd.core.waiting import Progress, WaitPhase
from ktd.frontend.waits import look_of, request_id_of, sse_event

P = Progress(WaitPhase.QUEUED, "m", 3, 3, 1.5, eta=4.0)


def data_of(event: bytes) -> tuple[str, dict[str, object]]:
    head, data = event.decode().rstrip("\n").split("\n")
    assert event.endswith(b"\n\n")
    return head, json.loads(data.removeprefix("data: "))


def test_openai_gets_an_empty_chunk_named_ktd_progress() -> None:
    head, chunk = data_of(sse_event("chat", P, "m", reasoning=False))
    assert head == "event: ktd.progress"
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"] == []
    assert chunk["ktd_progress"] == P.doc()
    _, text = data_of(sse_event("completions", P, "m", reasoning=True))
    assert text["object"] == "text_completion" and text["choices"] == []  # no reasoning there


def test_reasoning_goes_in_reasoning_content_never_content() -> None:
    _, chunk = data_of(sse_event("chat", P, "m", reasoning=True))
    [choice] = chunk["choices"]  # type: ignore[misc]
    assert choice["delta"] == {
        "role": "assistant",
        "reasoning_content": "queued for m: 2 request(s) ahead, 1s so far, ~4s to go\n",
    }


def test_anthropic_gets_a_ping_and_other_routes_nothing() -> None:
    head, ping = data_of(sse_event("messages", P, "m", reasoning=True))
    assert head == "event: ping" and ping == {"type": "ping", "ktd_progress": P.doc()}
    for endpoint in ("responses", "generate", "ollama_chat"):
        assert sse_event(endpoint, P, "m", reasoning=True) == b""


def test_a_client_request_id_is_kept_only_if_the_status_route_can_name_it() -> None:
    assert request_id_of(b" 0f8c-ab_12 ") == "0f8c-ab_12"
    assert request_id_of(None) is None
    assert request_id_of(b"a/b") is None and request_id_of(b"x" * 201) is None
    assert request_id_of("é1".encode()) is None


def test_the_engine_as_a_wait_sees_it() -> None:
    starting = p.EngineInfo(
        alias="m", state="starting", step="loading", phase="loading weights",
        load_started=100.0, load_eta=60.0, load_percent=25.0, since=90.0,
    )  # fmt: skip
    look = look_of(starting, 130.0)
    assert (look.elapsed, look.load_eta, look.percent) == (30.0, 60.0, 25.0)
    assert look.phase == "loading weights"
    waking = look_of(p.EngineInfo(alias="m", state="waking", since=128.0), 130.0)
    assert (waking.state, waking.elapsed) == ("waking", 2.0)
