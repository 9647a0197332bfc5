"""Decoding what others wrote: every msgpack frame and JSON text ktd did not make itself
goes through here, so bad input is one typed error and never anything else.

Why: msgspec and the standard ``json`` recurse once per level of nesting, so a 1 KB
control frame of 1,000 nested arrays (in any field, even one the decoder skips) raised
``RecursionError`` out of ``decode_request``, through the socket's pump, into the
daemon's nursery: ktd exited and its engines with it. The limit is checked here, before
a decoder recurses, by scanners that do not recurse (``check_msgpack``,
``check_json``): nesting deeper than ``MAX_DEPTH`` is refused the same way wherever
the decoder is called from, however deep the caller's own stack. Then the decode
itself runs under a last-resort guard: whatever a decoder raises other than its own
``msgspec.DecodeError`` (a ``RecursionError`` all the same, a ``MemoryError``, a bug in
a ``__post_init__``) comes out as ``Malformed``.

``Malformed`` is a ``msgspec.DecodeError`` (and so a ``ValueError``): every caller that
already refused malformed input (``except msgspec.DecodeError`` or ``except ValueError``)
refuses this too, with no new branch. Pure: msgspec and the standard library only
(ktctl imports it, via ``ktd.protocol``).
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable
from itertools import accumulate
from typing import Any, TypeVar

import msgspec

__all__ = [
    "MAX_DEPTH",
    "Malformed",
    "TooDeep",
    "check_json",
    "check_msgpack",
    "json",
    "json_any",
    "loads",
    "msgpack",
    "msgpack_any",
]

T = TypeVar("T")

#: The deepest nesting ktd decodes, in a control frame, an HTTP body or a config file:
#: far more than any of them needs (a tool's JSON schema, the doctor's report), far
#: less than Python's recursion limit (1,000 frames, the caller's stack included).
MAX_DEPTH = 128


class Malformed(msgspec.DecodeError):
    """Input ktd will not decode: not what it claims to be, or nested too deeply."""


class TooDeep(Malformed):
    """Nesting deeper than the limit: refused before any decoder recursed into it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"nested more than {limit} levels deep")


# ---------------------------------------------------------------- msgpack

# Each first byte's kind: how many bytes follow it (a scalar), how wide the length that
# follows it is (a str, bin or ext), or how many items it holds (a container).
_SCALAR, _SIZED, _CONTAINER, _INVALID = 0, 1, 2, 3


def _msgpack_table() -> tuple[tuple[int, int, int], ...]:
    """(kind, a, b) per first byte. Scalar: a = bytes after the header. Sized: a = the
    length's width, b = extra bytes (ext's type). Container: a = its items when the byte
    says how many (a map's entry is two items), else -1 (array16/32) or -2 (map16/32)
    times the count that follows, b bytes wide."""
    table: list[tuple[int, int, int]] = []
    fixed = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4}
    fixed |= {0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
    fixed |= {0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}  # fixext: type byte + data
    sized = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xD9: (1, 0), 0xDA: (2, 0)}
    sized |= {0xDB: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
    for b in range(256):
        if b <= 0x7F or b >= 0xE0:
            table.append((_SCALAR, 0, 0))
        elif b <= 0x8F:
            table.append((_CONTAINER, 2 * (b & 0x0F), 0))
        elif b <= 0x9F:
            table.append((_CONTAINER, b & 0x0F, 0))
        elif b <= 0xBF:
            table.append((_SCALAR, b & 0x1F, 0))
        elif b in fixed:
            table.append((_SCALAR, fixed[b], 0))
        elif b in sized:
            table.append((_SIZED, *sized[b]))
        elif b in (0xDC, 0xDD):
            table.append((_CONTAINER, -1, 2 if b == 0xDC else 4))
        elif b in (0xDE, 0xDF):
            table.append((_CONTAINER, -2, 2 if b == 0xDE else 4))
        else:
            table.append((_INVALID, 0, 0))  # 0xC1: never used
    return tuple(table)


_TABLE = _msgpack_table()
# Bytes that may open a container that holds something (fixmap, fixarray, array16/32,
# map16/32; an empty fixmap or fixarray is a leaf): a frame with fewer of them than the
# limit cannot be nested deeper, wherever they stand.
_NOT_OPENING = bytes(b for b in range(256) if _TABLE[b][0] != _CONTAINER or b in (0x80, 0x90))


def check_msgpack(data: bytes | bytearray | memoryview, limit: int = MAX_DEPTH) -> None:
    """``TooDeep`` if the msgpack in ``data`` nests containers deeper than ``limit``.

    Iterative: one step per item, strings and binaries skipped by the length in their
    header, so a 1 MiB string costs nothing. What is not msgpack (a short frame, a byte
    no encoder writes) is left to the decoder to refuse: this only bounds its depth.
    """
    data = bytes(data)
    if len(data.translate(None, _NOT_OPENING)) < limit:
        return  # the usual frame: too few container headers to be deep
    table, end, pos = _TABLE, len(data), 0
    stack: list[int] = []  # items left in each enclosing container
    left = 1  # items left at this level (the top: one object)
    while pos < end:
        while left == 0:
            if not stack:
                return  # one whole object read: what follows is the decoder's to refuse
            left = stack.pop()
        kind, a, b = table[data[pos]]
        pos += 1
        left -= 1
        if kind == _SCALAR:
            pos += a
        elif kind == _SIZED:
            pos += a + b + int.from_bytes(data[pos : pos + a], "big")
        elif kind == _CONTAINER:
            if len(stack) >= limit:
                raise TooDeep(limit)
            if a < 0:  # array16/32 (-1) or map16/32 (-2): the count follows
                count = -a * int.from_bytes(data[pos : pos + b], "big")
                pos += b
            else:
                count = a
            if count:
                stack.append(left)
                left = count
        else:
            return  # not msgpack: the decoder says so


# ---------------------------------------------------------------- JSON

_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def check_json(data: bytes | bytearray | memoryview | str, limit: int = MAX_DEPTH) -> None:
    """``TooDeep`` if the JSON in ``data`` nests arrays and objects deeper than ``limit``.

    Linear, and in C: escaped backslashes dropped (in pairs from the left of
    each run, as a decoder pairs them), then escaped quotes, then what stands between
    quotes (the strings), then everything but brackets; the deepest point is the highest
    running sum of +1 per opening and -1 per closing bracket. Exact for all of the text a
    decoder reads before it finds an error (its valid prefix), which is all that matters.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # the usual body: too few brackets to be deep
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    steps = memoryview(outside.translate(_STEPS, _NOT_BRACKET)).cast("b")
    if max(accumulate(steps), default=0) > limit:
        raise TooDeep(limit)


# ---------------------------------------------------------------- decoding


def _guarded(decode: Callable[[Any], T], data: Any) -> T:
    """The last resort: a decoder raises its own ``DecodeError`` or ``Malformed``."""
    try:
        return decode(data)
    except msgspec.DecodeError:
        raise
    except RecursionError:
        raise Malformed("nested too deeply to decode") from None
    except Exception as exc:  # a decoder's surprise is still the input's fault
        raise Malformed(f"cannot decode: {type(exc).__name__}: {exc}") from exc


_any_msgpack: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder()
_any_json: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def msgpack(data: bytes, decoder: msgspec.msgpack.Decoder[T], *, limit: int = MAX_DEPTH) -> T:
    """``decoder.decode(data)`` of a frame someone else wrote, its depth checked first."""
    check_msgpack(data, limit)
    return _guarded(decoder.decode, data)


def msgpack_any(data: bytes, *, limit: int = MAX_DEPTH) -> Any:
    """A frame someone else wrote as plain objects, its depth checked first."""
    return msgpack(data, _any_msgpack, limit=limit)


def json(data: bytes | str, decoder: msgspec.json.Decoder[T], *, limit: int = MAX_DEPTH) -> T:
    """``decoder.decode(data)`` of JSON someone else wrote, its depth checked first."""
    check_json(data, limit)
    return _guarded(decoder.decode, data)


def json_any(data: bytes | str, *, limit: int = MAX_DEPTH) -> Any:
    """JSON someone else wrote as plain objects, its depth checked first."""
    return json(data, _any_json, limit=limit)


def loads(text: str | bytes, *, limit: int = MAX_DEPTH) -> Any:
    """The standard library's ``json.loads`` (its numbers, its duplicate keys) of a text
    someone else wrote, its depth checked first. Its ``JSONDecodeError`` stays what it is
    (a ``ValueError``, as ``Malformed`` is): callers show its line and column."""
    check_json(text, limit)
    try:
        return _json.loads(text)
    except ValueError:
        raise
    except RecursionError:
        raise Malformed("nested too deeply to decode") from None
    except Exception as exc:
        raise Malformed(f"cannot decode: {type(exc).__name__}: {exc}") from exc
