"""Deterministic "model": token texts, prompt token counts, finish reasons, embeddings.

Why deterministic: tests and benchmarks must know exactly what an engine
answers. Token ``i`` is ``"tok<i>"`` (with a leading space after the first),
so a reply of N tokens reads ``tok0 tok1 ... tok<N-1>``. A prompt counts one
token per whitespace-separated word (a list of token ids counts its length).

Finish reasons follow SGLang: ``length`` when ``max_tokens`` ran out, ``stop``
with ``matched_stop`` = the stop string when one appears in the output (the
output is cut before it), and ``stop`` with ``matched_stop`` = the EOS token id
when no ``max_tokens`` was asked (the "model" then ends on its own after
``NATURAL_TOKENS`` tokens).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

EOS_TOKEN_ID = 1
NATURAL_TOKENS = 16
EMBEDDING_DIM = 64


def token_text(i: int) -> str:
    return f"tok{i}" if i == 0 else f" tok{i}"


def count_text(text: str) -> int:
    return len(text.split())


def count_content(content: object) -> int:
    """A chat message's content: a string, or a list of parts (text parts count)."""
    if isinstance(content, str):
        return count_text(content)
    total = 0
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += count_text(part["text"])
    return total


def count_prompt(prompt: object) -> int:
    """A completion prompt item: text, or a list of token ids."""
    if isinstance(prompt, str):
        return count_text(prompt)
    if isinstance(prompt, list):
        return len(prompt)
    return 0


@dataclass(frozen=True)
class ChoicePlan:
    """What one choice generates, known before the first token is sent."""

    n_tokens: int  # completion tokens (usage)
    finish_reason: str
    matched_stop: int | str | None
    cut: int | None = None  # output text is cut at this many characters (a stop string)

    def pieces(self) -> Iterator[str]:
        """One text delta per generated token (may be "" after a stop cut)."""
        pos = 0
        for i in range(self.n_tokens):
            piece = token_text(i)
            if self.cut is not None and pos + len(piece) > self.cut:
                piece = piece[: max(0, self.cut - pos)]
            pos += len(piece)
            yield piece

    def text(self) -> str:
        return "".join(self.pieces())


def plan(max_tokens: int | None, stop: Sequence[str] = ()) -> ChoicePlan:
    n = NATURAL_TOKENS if max_tokens is None else max_tokens
    # Without max_tokens the "model" ends on EOS; with it, it runs out of budget.
    base = (
        ChoicePlan(n, "stop", EOS_TOKEN_ID) if max_tokens is None else ChoicePlan(n, "length", None)
    )
    stops = [s for s in stop if s]
    if not stops or n == 0:
        return base
    text = "".join(token_text(i) for i in range(n))
    best: tuple[int, str] | None = None
    for s in stops:
        idx = text.find(s)
        if idx >= 0 and (best is None or idx < best[0]):
            best = (idx, s)
    if best is None:
        return base
    idx, s = best
    end = idx + len(s)
    pos = 0
    used = n
    for i in range(n):
        pos += len(token_text(i))
        if pos >= end:
            used = i + 1
            break
    return ChoicePlan(used, "stop", s, cut=idx)


def embedding(item: object, dim: int = EMBEDDING_DIM) -> list[float]:
    """A unit vector that depends only on the input."""
    key = repr(item).encode()
    raw = b""
    counter = 0
    while len(raw) < dim * 4:
        raw += hashlib.sha256(key + counter.to_bytes(4, "little")).digest()
        counter += 1
    ints = struct.unpack(f"<{dim}I", raw[: dim * 4])
    vec = [v / 2147483647.5 - 1.0 for v in ints]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]
