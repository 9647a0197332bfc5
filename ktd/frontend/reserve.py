"""What a request may cost, read from its body before it is admitted (pure).

A key with ``tokens_per_day`` reserves this much of its day when its request is admitted
(``ktd.core.budget``), and gets back what the engine did not use when it ends. The
reservation is the completion the request may ask of the engine, times its choices
(``n``), plus an estimate of its prompt:

* the completion limit it names: ``max_completion_tokens``/``max_tokens`` (OpenAI's
  chat), ``max_tokens`` (completions, Anthropic's messages), ``max_output_tokens``
  (Responses), ``options.num_predict`` (Ollama), ``sampling_params.max_new_tokens``
  (SGLang's ``/generate``);
* else SGLang's own default for the route (``sglang/srt/entrypoints/openai/protocol.py``:
  ``CompletionRequest.max_tokens = 16``; ``ollama/serving.py``: ``max_new_tokens`` 2048;
  ``sampling/sampling_params.py``: ``max_new_tokens = 128`` for ``/generate``);
* where SGLang has none (chat without ``max_tokens``, Responses, a message without
  ``max_tokens``: SGLang generates until the context ends), ``DEFAULT_RESERVE`` tokens;
* the prompt: one token per ``BYTES_PER_TOKEN`` bytes of the JSON body (English text is
  about four bytes a token; the body's own keys make up for a chat template's tokens).

Routes that generate nothing (embeddings, scores, tokenize...) reserve their prompt only;
a request the engine answers more cheaply than reserved gives the rest back at its end.
Only requests of keys with a ``tokens_per_day`` are read here (the body is decoded once
more for them).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ktd.core.admission import KeyTerms

__all__ = ["BYTES_PER_TOKEN", "DEFAULT_RESERVE", "of", "reservation"]

#: Tokens reserved for a completion that names no limit where SGLang has none (it
#: generates until the context ends): a day's budget is not spent on a guess of the
#: context, and what the request really used is counted when it ends.
DEFAULT_RESERVE = 1024
#: Bytes of a JSON body per prompt token, for the prompt's estimate.
BYTES_PER_TOKEN = 4
#: No single request reserves more than this (a ``max_tokens`` of 10**12 is served alone).
_MOST = 2**31

#: SGLang's default completion limit per route, where it has one (None: the context).
_DEFAULTS: dict[str, int | None] = {
    "chat": None,
    "completions": 16,
    "responses": None,
    "messages": None,
    "ollama_chat": 2048,
    "ollama_generate": 2048,
    "generate": 128,
}

_decoder = msgspec.json.Decoder()


def of(key: KeyTerms, endpoint: str, body: bytes) -> int:
    """What ``key``'s request reserves: ``reservation``, for a key with a
    ``tokens_per_day`` (nothing is read for the others)."""
    return 0 if key.tokens_per_day is None else reservation(endpoint, body)


def reservation(endpoint: str, body: bytes) -> int:
    """Tokens a request to ``endpoint`` (routes.py's name) with ``body`` may cost."""
    prompt = len(body) // BYTES_PER_TOKEN
    if endpoint not in _DEFAULTS:
        return prompt  # generates nothing
    try:
        obj = _decoder.decode(body)
    except msgspec.DecodeError:
        obj = None
    if not isinstance(obj, dict):
        obj = {}
    limit = _asked(endpoint, obj)
    if limit is None:
        limit = _DEFAULTS[endpoint]
    completion = DEFAULT_RESERVE if limit is None else limit
    return min(_MOST, prompt + completion * _choices(obj))


def _asked(endpoint: str, obj: dict[str, Any]) -> int | None:
    """The completion limit the body names, if it names one."""
    if endpoint == "chat":
        return _count(obj.get("max_completion_tokens")) or _count(obj.get("max_tokens"))
    if endpoint in ("completions", "messages"):
        return _count(obj.get("max_tokens"))
    if endpoint == "responses":
        return _count(obj.get("max_output_tokens"))
    if endpoint in ("ollama_chat", "ollama_generate"):
        options = obj.get("options")
        return _count(options.get("num_predict")) if isinstance(options, dict) else None
    params = obj.get("sampling_params")  # /generate
    return _count(params.get("max_new_tokens")) if isinstance(params, dict) else None


def _count(value: object) -> int | None:
    """A positive whole number of tokens, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, _MOST)
    return None


def _choices(obj: dict[str, Any]) -> int:
    """How many completions the request asks for (OpenAI's ``n``)."""
    return min(_count(obj.get("n")) or 1, 128)
