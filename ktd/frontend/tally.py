"""What a request cost, read from the engine's own answer (pure).

Why here and how: the usage ledger counts the tokens the engine itself reports, never an
estimate: a non-streamed body's ``usage`` (OpenAI), ``usage.input_tokens``/
``output_tokens`` (Anthropic), ``prompt_eval_count``/``eval_count`` (Ollama), or SGLang's
``meta_info`` (its native ``/generate``). A stream says it at its end: SGLang's usage
chunk (``choices: []``, the last event before ``[DONE]``), Ollama's last line
(``done: true``), Anthropic's ``message_start`` (input) and ``message_delta``
(output). The relay passes every chunk on untouched and keeps only references to the
first and the last few; they are parsed once, when the stream has ended. So the cost
per chunk is a few attribute stores (bench/proxy_stream.py measures it).

An OpenAI stream whose client did not ask for usage gets it asked for
(``stream_options.include_usage``) and its usage event taken out before the client sees
it (``strip``): the one case where a chunk is looked at, for the usage chunk's marker.

A stream the client hangs up on never reaches its usage chunk (issue 43: such streams
cost nothing, and a key past its day was served on). So the relay also counts, per chunk
(one ``bytes.count``), the events that carry tokens: SSE events (``\n\n``) less the
role chunks that open OpenAI's chat and the ``[DONE]``, Anthropic's
``content_block_delta`` events, Ollama's lines. SGLang sends one such event per token
(its ``stream_interval`` is 1 by default), so a stream cut short is charged the
completion tokens the client received; the engine's own figure wins wherever the kept
chunks have one (a usage chunk, continuous usage stats, ``meta_info`` of ``/generate``,
Anthropic's ``message_start`` for the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ktd import foreign

Api = Literal["openai", "anthropic", "ollama"]

_KEY = b'"usage":'
_decoder = msgspec.json.Decoder()


@dataclass(frozen=True)
class Tokens:
    prompt: int
    completion: int


def ask_for_usage(body: bytes) -> bytes | None:
    """``body`` (an OpenAI streaming request) asking for the usage chunk, or None when it
    asks already (then the client wants it: nothing is taken out) or is no JSON object."""
    if b'"stream_options"' not in body:
        # The common case: one member in front, the rest of the body as it came.
        start = body.find(b"{") + 1
        if not start or body[:start].strip() != b"{":
            return None
        comma = b"" if body[start:].lstrip().startswith(b"}") else b","
        return body[:start] + b'"stream_options":{"include_usage":true}' + comma + body[start:]
    try:
        obj = foreign.json(body, _decoder)
    except msgspec.DecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    options = obj.get("stream_options")
    given = options if isinstance(options, dict) else {}
    if given.get("include_usage") is True:
        return None
    obj["stream_options"] = {**given, "include_usage": True}
    return msgspec.json.encode(obj)


def body_tokens(api: Api, data: bytes) -> Tokens | None:
    """The tokens a non-streamed answer reports, if it does."""
    try:
        obj = foreign.json(data, _decoder)
    except msgspec.DecodeError:
        return None
    return _tokens(api, obj) if isinstance(obj, dict) else None


def _tokens(api: Api, obj: dict[str, Any]) -> Tokens | None:
    if api == "ollama":
        return _pair(obj.get("prompt_eval_count"), obj.get("eval_count"))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if api == "anthropic":
            return _pair(usage.get("input_tokens"), usage.get("output_tokens"))
        return _pair(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    meta = obj.get("meta_info")  # SGLang's native /generate
    if isinstance(meta, dict):
        return _pair(meta.get("prompt_tokens"), meta.get("completion_tokens"))
    return None


def _pair(prompt: object, completion: object) -> Tokens | None:
    p = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None
    c = completion if isinstance(completion, int) and not isinstance(completion, bool) else None
    if p is None and c is None:
        return None
    return Tokens(max(p or 0, 0), max(c or 0, 0))


class StreamTally:
    """One stream's chunks as they pass: the first two and the last three are kept (by
    reference), and ``tokens()`` reads them once the stream has ended."""

    __slots__ = ("_held", "_mark", "api", "events", "first", "last", "strip", "stripped")

    def __init__(self, api: Api, *, strip: bool = False) -> None:
        self.api = api
        self.events = 0  # token-bearing events passed on (``_mark``s counted)
        self._mark = _MARKS[api]
        self.strip = strip  # the usage event was asked for by ktd: the client never sees it
        self.first: list[bytes] = []  # Anthropic's message_start is in the first events
        self.last: list[bytes] = [b"", b"", b""]
        self.stripped = b""  # the usage event taken out
        self._held = b""  # strip: the start of an event not yet complete

    def pass_on(self, piece: bytes) -> bytes:
        """What of ``piece`` goes to the client (all of it, unless stripping)."""
        self.events += piece.count(self._mark)
        if len(self.first) < 2:
            self.first.append(piece)
        last = self.last
        last[0], last[1], last[2] = last[1], last[2], piece
        if not self.strip:
            return piece
        if self._held:
            piece, self._held = self._held + piece, b""
        if not piece.endswith(b"\n\n"):  # an event cut across reads: hold its start
            end = piece.rfind(b"\n\n")
            cut = end + 2 if end >= 0 else 0
            piece, self._held = piece[:cut], piece[cut:]
        at = _usage_at(piece)
        if at < 0:
            return piece
        start = piece.rfind(b"data: ", 0, at)
        end = piece.find(b"\n\n", at) + 2
        self.stripped = piece[start:end]
        return piece[:start] + piece[end:]

    def rest(self) -> bytes:
        """What is still held back when the stream ends (an unterminated last event)."""
        held, self._held = self._held, b""
        return held

    def tokens(self) -> Tokens | None:
        """The stream's usage (call once it has ended, or was cut short): the engine's
        own figure from the kept chunks, else the token-bearing events counted."""
        told = self._told()
        if told is not None and (told.completion or not self.received()):
            return told
        got = self.received()
        if not got and told is None:
            return None
        return Tokens(told.prompt if told is not None else 0, got)

    def received(self) -> int:
        """Completion tokens the client received, one per token-bearing event counted."""
        if self.api != "openai":
            return self.events
        head = b"".join(self.first)
        roles = head.count(b'"role":"assistant"') + head.count(b'"role": "assistant"')
        done = b"".join(self.last).count(b"[DONE]")
        usage = 1 if self.stripped or _usage_at(b"".join(self.last), last=True) >= 0 else 0
        return max(0, self.events - roles - done - usage)

    def _told(self) -> Tokens | None:
        """The engine's own figure, where the kept chunks have one."""
        if self.api == "ollama":
            lines = b"".join(self.last).rstrip(b"\n").rsplit(b"\n", 1)
            return body_tokens("ollama", lines[-1]) if lines else None
        if self.api == "anthropic":
            started = _event_with(b"".join(self.first), b'"message_start"')
            ended = _event_with(b"".join(self.last), b'"message_delta"')
            prompt = _tokens("anthropic", started.get("message") or {}) if started else None
            done = _tokens("anthropic", ended) if ended else None
            if prompt is None and done is None:
                return None
            return Tokens(prompt.prompt if prompt else 0, done.completion if done else 0)
        data = self.stripped or b"".join(self.last)
        at = _usage_at(data, last=True)  # with continuous usage, every chunk has one
        if at < 0:  # SGLang's /generate: every chunk's meta_info counts so far
            at = data.rfind(b'"meta_info"')
        event = _event_at(data, at) if at >= 0 else None
        return _tokens("openai", event) if event else None


#: What marks a token-bearing event in each API's stream (``StreamTally.received``).
_MARKS: dict[Api, bytes] = {
    "openai": b"\n\n",
    "anthropic": b"event: content_block_delta",
    "ollama": b"\n",
}


def _usage_at(data: bytes, *, last: bool = False) -> int:
    """Where the first (``last``: the last) ``"usage":`` member holding an object is
    (``"usage": null`` is not one: an engine may put it in every chunk), or -1."""
    at = data.rfind(_KEY) if last else data.find(_KEY)
    while at >= 0:
        value = data[at + len(_KEY) : at + len(_KEY) + 2].lstrip()
        if value.startswith(b"{"):
            return at
        at = data.rfind(_KEY, 0, at) if last else data.find(_KEY, at + len(_KEY))
    return -1


def _event_with(data: bytes, marker: bytes) -> dict[str, Any] | None:
    """The last ``data:`` event of ``data`` that holds ``marker``, decoded."""
    at = data.rfind(marker)
    return _event_at(data, at) if at >= 0 else None


def _event_at(data: bytes, at: int) -> dict[str, Any] | None:
    """The ``data:`` event of ``data`` around position ``at``, decoded."""
    start = data.rfind(b"data:", 0, at)
    end = data.find(b"\n", at)
    if start < 0:
        return None
    try:
        obj = foreign.json(data[start + 5 : end if end >= 0 else len(data)], _decoder)
    except msgspec.DecodeError:
        return None
    return obj if isinstance(obj, dict) else None
