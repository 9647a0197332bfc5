"""What a request reserves of its key's day (``ktd.frontend.reserve``): its completion
limit (or SGLang's default for the route), times ``n``, plus its prompt's estimate."""

from __future__ import annotations

import json

import pytest

from ktd.core.admission import ANYONE, KeyTerms
from ktd.frontend.reserve import BYTES_PER_TOKEN, DEFAULT_RESERVE, of, reservation


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("endpoint", "obj", "completion"),
    [
        ("chat", {"max_tokens": 50}, 50),
        ("chat", {"max_completion_tokens": 30, "max_tokens": 50}, 30),
        ("chat", {"max_tokens": 50, "n": 3}, 150),
        ("chat", {}, DEFAULT_RESERVE),  # SGLang: until the context ends
        ("chat", {"max_tokens": True}, DEFAULT_RESERVE),  # not a number of tokens
        ("completions", {}, 16),  # SGLang's CompletionRequest default
        ("completions", {"max_tokens": 7}, 7),
        ("messages", {"max_tokens": 9}, 9),
        ("responses", {"max_output_tokens": 12}, 12),
        ("responses", {}, DEFAULT_RESERVE),
        ("ollama_chat", {"options": {"num_predict": 5}}, 5),
        ("ollama_generate", {"options": {"num_predict": -1}}, 2048),  # SGLang's default
        ("generate", {"sampling_params": {"max_new_tokens": 4}}, 4),
        ("generate", {}, 128),  # SamplingParams.max_new_tokens
        ("embeddings", {"max_tokens": 99}, 0),  # generates nothing
    ],
)
def test_a_request_reserves_its_completion_and_its_prompt(
    endpoint: str, obj: dict[str, object], completion: int
) -> None:
    data = body({"model": "m", **obj})
    assert reservation(endpoint, data) == completion + len(data) // BYTES_PER_TOKEN


def test_a_body_that_is_no_json_object_reserves_the_route_s_default() -> None:
    assert reservation("completions", b"[1, 2]") == 16 + 1
    assert reservation("chat", b"not json") == DEFAULT_RESERVE + 2


def test_only_a_key_with_a_day_of_tokens_is_read() -> None:
    data = body({"model": "m", "max_tokens": 10**15})
    assert of(ANYONE, "chat", data) == 0
    assert of(KeyTerms("k", tokens_per_day=5), "chat", data) == 2**31  # capped: served alone
