"""Ollama's ``keep_alive`` and its load and unload requests (pure but for the answer).

Why: Ollama's clients say how long a model stays loaded once idle with ``keep_alive``
on ``/api/generate`` and ``/api/chat`` (a duration: ``"5m"``, ``300``, negative for
ever), unload it with ``keep_alive: 0`` (what ``ollama stop`` sends: a generate with no
prompt), and load it with an empty request. ktd carries the duration to the daemon
(``KeepAlive``: the engine's idle TTL until it next stops, so ``/api/ps`` shows the
expiry Ollama would) and answers the empty requests itself, as Ollama does
(``done_reason`` ``load`` or ``unload``), where SGLang would refuse a missing prompt.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import msgspec

from ktd import foreign
from ktd.ollama_shapes import timestamp

FOREVER = math.inf

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class _Extras(msgspec.Struct):
    keep_alive: Any = msgspec.UNSET
    prompt: Any = msgspec.UNSET
    messages: Any = msgspec.UNSET


_decoder = msgspec.json.Decoder(_Extras)


def duration(value: object) -> float:
    """Ollama's ``api.Duration``: a number of seconds, or a Go duration string
    (``"1h30m"``, ``"0"``); negative means for ever (``FOREVER``). ``ValueError`` else."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        return FOREVER if value < 0 else float(int(value))
    if not isinstance(value, str):
        raise ValueError(f"keep_alive: expected a duration, got {value!r}")
    text = value.strip()
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if text == "0":
        return 0.0
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"keep_alive: time: invalid duration {value!r}")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return FOREVER if sign < 0 else seconds


Kind = Literal["load", "unload", "generate"]


def read(body: bytes, route: str) -> tuple[Kind, float | None]:
    """What an Ollama request asks: a generation, or only a load or an unload (no
    prompt, no messages); and its ``keep_alive`` (None: none given)."""
    try:
        extras = foreign.json(body, _decoder)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "generate", None  # the route's own parse reports the body
    keep = None if extras.keep_alive in (msgspec.UNSET, None) else duration(extras.keep_alive)
    content = extras.prompt if route == "/api/generate" else extras.messages
    if content in (msgspec.UNSET, None, "", []):
        return ("unload" if keep == 0 else "load"), keep
    return "generate", keep


def answer(model: str, route: str, kind: Kind) -> bytes:
    """Ollama's reply to a load or an unload request."""
    body: dict[str, Any] = {"model": model, "created_at": timestamp(), "done": True}
    if route == "/api/chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body["done_reason"] = kind
    return msgspec.json.encode(body)
