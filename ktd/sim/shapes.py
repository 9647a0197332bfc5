"""JSON shapes of SGLang's OpenAI-compatible API, as its pydantic models serialise them.

Why exact shapes: ktd's frontend passes engine bytes through to OpenAI
clients and its tests compare against what SGLang really sends. SGLang dumps
every field, ``null`` included (``reasoning_content``, ``tool_calls``,
``logprobs``, ``matched_stop`` ...), so these builders do too.

Errors: SGLang answers OpenAI-route failures with a *top-level*
``{"object": "error", "message", "type", "param", "code"}`` (``type``
``BadRequestError`` for 400s), request validation failures (bad JSON, a wrong
field type) with the same shape but ``type`` ``"Bad Request"`` as FastAPI's
validation handler sets it, and errors found after a stream has started as one
``data: {"error": {...}}`` event followed by ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ktd.sim.httpd import JSON, HttpReply

_encode = msgspec.json.Encoder().encode

DONE = b"data: [DONE]\n\n"
WEIGHT_VERSION = "default"
# What SGLang answers the embedding routes (embeddings, rerank, classify) of a
# generation model, launched without ``--is-embedding``.
NOT_EMBEDDING = (
    "This model does not appear to be an embedding model by default. Please add "
    "`--is-embedding` when launching the server or try another model."
)


def dumps(obj: object) -> bytes:
    return _encode(obj)


def json_reply(obj: object, status: int = 200) -> HttpReply:
    return HttpReply(status, _encode(obj), JSON)


def sse(obj: object) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


# -- errors
def error_obj(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": code}


def error_reply(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> HttpReply:
    return json_reply(error_obj(message, err_type, code, param), code)


def stream_error(message: str, err_type: str = "BadRequestError", code: int = 400) -> bytes:
    return sse({"error": error_obj(message, err_type, code)})


def field_error(kind: str, loc: Sequence[str | int], msg: str, value: object) -> dict[str, Any]:
    """One pydantic-style validation error (``loc`` without the leading ``"body"``)."""
    return {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}


def validation_reply(errors: Sequence[Mapping[str, Any]]) -> HttpReply:
    """FastAPI's RequestValidationError as SGLang rewrites it: 400, ``type`` "Bad Request"."""
    plural = "s" if len(errors) != 1 else ""
    text = f"{len(errors)} validation error{plural}:\n" + "".join(f"  {e}\n" for e in errors)
    message = f"{text} {list(errors)}"
    return error_reply(message, "Bad Request", 400)


# -- usage and models
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def model_card(served: str, root: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "id": served,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
    }


def _head(
    rid: str, kind: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """What every OpenAI answer of choices starts with, in SGLang's key order (a chat
    completion, its chunks, a text completion): the rest follows it."""
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}


# -- chat
def delta_choice(
    index: int,
    *,
    role: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
) -> dict[str, Any]:
    # 0.5.23 leaves unset delta fields out, but for ``reasoning_content`` (measured).
    delta: dict[str, Any] = {"reasoning_content": None}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }


def chat_chunk(
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_obj: dict[str, Any] | None = None,
) -> dict[str, Any]:
    chunk = _head(rid, "chat.completion.chunk", created, model, choices)
    if usage_obj is not None:  # 0.5.23's chunks carry no ``usage`` key until the last
        chunk["usage"] = usage_obj
    return chunk


def chat_choice(
    index: int, text: str, finish_reason: str, matched_stop: int | str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": None,
        },
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }


def chat_response(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], usage_obj: dict[str, Any]
) -> dict[str, Any]:
    return {
        **_head(rid, "chat.completion", created, model, choices),
        "usage": usage_obj,
        "metadata": {"weight_version": WEIGHT_VERSION},
    }


# -- completions
def text_choice(
    index: int, text: str, finish_reason: str | None, matched_stop: int | str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }


def completion_obj(
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_obj: dict[str, Any] | None,
    *,
    final: bool,
) -> dict[str, Any]:
    obj = {**_head(rid, "text_completion", created, model, choices), "usage": usage_obj}
    if final:
        obj["metadata"] = {"weight_version": WEIGHT_VERSION}
    return obj


# -- embeddings
def embedding_response(
    model: str, vectors: list[list[float]], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "data": [
            {"embedding": v, "index": i, "object": "embedding"} for i, v in enumerate(vectors)
        ],
        "model": model,
        "object": "list",
        "usage": usage(prompt_tokens, 0),
    }


# -- /v1/responses (OpenAI Responses API, as SGLang's serving_responses builds it)
def response_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content: list[dict[str, Any]] = [
        {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
    ]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content if text or status == "completed" else [],
    }


def response_obj(
    rid: str,
    created: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage_obj: dict[str, Any] | None,
    *,
    max_output_tokens: int | None,
    instructions: str | None,
    previous_response_id: str | None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": instructions,
        "max_output_tokens": max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": previous_response_id,
        "reasoning": None,
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage_obj,
        "user": None,
        "metadata": {},
    }


def named_event(event: str, obj: object) -> bytes:
    """``event: <type>`` + ``data:``: the framing of Responses and Anthropic streams."""
    return b"event: " + event.encode() + b"\ndata: " + _encode(obj) + b"\n\n"


# -- /v1/messages (Anthropic Messages API, SGLang's anthropic/serving.py)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": 0,
    }


def anthropic_message(
    mid: str, model: str, text: str | None, stop_reason: str | None, usage_obj: dict[str, Any]
) -> dict[str, Any]:
    """Serialised with ``exclude_none``, as SGLang does: no null fields at all."""
    obj: dict[str, Any] = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "content": [] if text is None else [{"type": "text", "text": text}],
        "model": model,
        "usage": usage_obj,
    }
    if stop_reason is not None:
        obj["stop_reason"] = stop_reason
    return obj


def anthropic_error(
    message: str, err_type: str = "invalid_request_error", code: int = 400
) -> HttpReply:
    return json_reply({"type": "error", "error": {"type": err_type, "message": message}}, code)
