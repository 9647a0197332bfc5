"""The tally: a request's tokens as the engine reported them, read once at the end."""

from __future__ import annotations

import json

import pytest

from ktd.frontend.tally import StreamTally, Tokens, ask_for_usage, body_tokens


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


CHUNK = sse(
    {"id": "1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]}
)
USAGE = sse({"id": "1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
DONE = b"data: [DONE]\n\n"


def test_the_usage_chunk_is_asked_for_in_place_or_left_as_the_client_asked() -> None:
    body = b'{"model":"m","stream":true,"messages":[]}'
    asked = ask_for_usage(body)
    assert asked is not None
    assert json.loads(asked)["stream_options"] == {"include_usage": True}
    assert asked.endswith(body[1:])  # the client's body follows unchanged
    assert json.loads(ask_for_usage(b" {}") or b"") == {"stream_options": {"include_usage": True}}
    mine = b'{"model":"m","stream_options":{"include_usage":true}}'
    assert ask_for_usage(mine) is None  # the client wants it: it sees it
    off = ask_for_usage(b'{"model":"m","stream_options":{"include_usage":false,"x":1}}')
    assert off is not None
    assert json.loads(off)["stream_options"] == {"include_usage": True, "x": 1}
    assert ask_for_usage(b"[1]") is None and ask_for_usage(b"not json") is None


@pytest.mark.parametrize(
    ("api", "body", "tokens"),
    [
        ("openai", {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}, Tokens(5, 2)),
        ("anthropic", {"usage": {"input_tokens": 4, "output_tokens": 9}}, Tokens(4, 9)),
        ("ollama", {"done": True, "prompt_eval_count": 3, "eval_count": 8}, Tokens(3, 8)),
        ("openai", {"meta_info": {"prompt_tokens": 1, "completion_tokens": 6}}, Tokens(1, 6)),
        ("openai", {"choices": []}, None),
        ("ollama", {"done": True}, None),
    ],
)
def test_a_body_s_usage(api: str, body: object, tokens: Tokens | None) -> None:
    assert body_tokens(api, json.dumps(body).encode()) == tokens  # type: ignore[arg-type]
    assert body_tokens(api, b"{broken") is None  # type: ignore[arg-type]


def test_a_stream_s_usage_chunk_is_read_at_the_end_and_passed_on_when_asked_for() -> None:
    tally = StreamTally("openai")
    pieces = [CHUNK, CHUNK, USAGE, DONE]
    assert [tally.pass_on(p) for p in pieces] == pieces
    assert tally.rest() == b"" and tally.tokens() == Tokens(7, 3)


def test_a_usage_chunk_ktd_asked_for_is_taken_out_even_across_reads() -> None:
    tally = StreamTally("openai", strip=True)
    whole = CHUNK + USAGE + DONE
    cut = len(CHUNK) + 20  # the usage event split across two reads
    seen = tally.pass_on(CHUNK) + tally.pass_on(whole[len(CHUNK) : cut])
    seen += tally.pass_on(whole[cut:]) + tally.rest()
    assert seen == CHUNK + DONE
    assert tally.tokens() == Tokens(7, 3)


def test_usage_null_in_every_chunk_is_not_the_usage_chunk() -> None:
    nulls = sse({"id": "1", "choices": [{"delta": {}}], "usage": None})
    usage = {"id": "1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    spaced = b"data: " + json.dumps(usage).encode() + b"\n\n"  # json.dumps spaces it
    tally = StreamTally("openai", strip=True)
    seen = b"".join(tally.pass_on(p) for p in (nulls, nulls, spaced, DONE)) + tally.rest()
    assert seen == nulls + nulls + DONE
    assert tally.tokens() == Tokens(2, 1)


def test_a_stream_without_usage_counts_the_tokens_it_passed_on() -> None:
    tally = StreamTally("openai")
    for piece in (CHUNK, DONE):
        tally.pass_on(piece)
    assert tally.tokens() == Tokens(0, 1)
    assert StreamTally("openai").tokens() is None  # nothing passed, nothing known


ROLE = sse(
    {
        "id": "1",
        "object": "chat.completion.chunk",
        "choices": [{"delta": {"role": "assistant", "content": ""}}],
    }
)


@pytest.mark.parametrize("strip", [False, True])
def test_an_openai_stream_cut_short_is_charged_the_tokens_it_passed_on(strip: bool) -> None:
    """Issue 43, item 3: a client that hung up before the usage chunk cost nothing."""
    tally = StreamTally("openai", strip=strip)
    tally.pass_on(ROLE)
    tally.pass_on(CHUNK * 3)  # three events in one read
    for _ in range(4):
        tally.pass_on(CHUNK)
    assert tally.tokens() == Tokens(0, 7)  # the role chunk carries none


def test_continuous_usage_and_generate_s_meta_info_are_the_engine_s_own_count() -> None:
    running = sse(
        {
            "id": "1",
            "choices": [{"delta": {"content": "x"}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 9},
        }
    )
    tally = StreamTally("openai")
    for piece in (ROLE, CHUNK, running):
        tally.pass_on(piece)
    assert tally.tokens() == Tokens(4, 9)  # the engine's count, not the two events
    native = StreamTally("openai")
    for n in range(1, 6):
        meta = {"prompt_tokens": 3, "completion_tokens": n}
        native.pass_on(sse({"text": "x" * n, "meta_info": meta}))
    assert native.tokens() == Tokens(3, 5)


def test_anthropic_cut_short_keeps_its_input_and_counts_its_deltas() -> None:
    def event(name: str, obj: object) -> bytes:
        return f"event: {name}\n".encode() + sse(obj)

    start = event(
        "message_start",
        {"type": "message_start", "message": {"usage": {"input_tokens": 11, "output_tokens": 1}}},
    )
    block = event("content_block_start", {"type": "content_block_start", "index": 0})
    delta = event("content_block_delta", {"type": "content_block_delta", "delta": {"text": "x"}})
    tally = StreamTally("anthropic")
    for piece in (start, block, *([delta] * 6)):
        tally.pass_on(piece)
    assert tally.tokens() == Tokens(11, 6)


def test_ollama_cut_short_counts_its_lines() -> None:
    tally = StreamTally("ollama")
    for _ in range(5):
        tally.pass_on(b'{"done":false,"message":{"content":"a"}}\n')
    assert tally.tokens() == Tokens(0, 5)


def test_anthropic_reads_its_input_at_the_start_and_its_output_at_the_end() -> None:
    def event(name: str, obj: object) -> bytes:
        return f"event: {name}\n".encode() + sse(obj)

    start = event(
        "message_start",
        {"type": "message_start", "message": {"usage": {"input_tokens": 11, "output_tokens": 0}}},
    )
    delta = event("content_block_delta", {"type": "content_block_delta", "delta": {"text": "x"}})
    end = event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 4}})
    stop = event("message_stop", {"type": "message_stop"})
    tally = StreamTally("anthropic")
    for piece in (start, *([delta] * 50), end, stop):
        tally.pass_on(piece)
    assert tally.tokens() == Tokens(11, 4)


def test_ollama_reads_its_last_line() -> None:
    tally = StreamTally("ollama")
    lines = [b'{"done":false,"message":{"content":"a"}}\n'] * 3
    lines.append(b'{"done":true,"prompt_eval_count":6,"eval_count":3}\n')
    for line in lines:
        tally.pass_on(line)
    assert tally.tokens() == Tokens(6, 3)
