"""Server-sent events as the dashboard sends them. Pure.

Every message is one ``event:`` with one ``data:`` line of JSON (msgspec never
writes a raw newline inside JSON). Comments (``: ping``) keep a quiet stream
moving, so neither a proxy nor the browser's own watchdog takes it for dead.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def event(name: str, data: bytes) -> bytes:
    """One SSE message; ``data`` is JSON (a newline in it would end the field)."""
    if b"\n" in data or b"\r" in data:
        raise ValueError("SSE data must be one line")
    return b"event: " + name.encode("ascii") + b"\ndata: " + data + b"\n\n"


def comment(text: str) -> bytes:
    return b": " + text.replace("\n", " ").encode("utf-8") + b"\n\n"


def retry(milliseconds: int) -> bytes:
    """How long the browser waits before it reconnects a stream that ended."""
    return f"retry: {int(milliseconds)}\n\n".encode("ascii")
