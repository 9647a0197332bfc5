"""The request id of a frame the daemon will not decode: too big, or malformed.

Why: a client waits on the id of its request, so even a refusal must carry it, or
the client waits out its timeout. A frame over ``MAX_FRAME`` is never decoded (that
is the point of the limit): its id is skimmed from the first bytes instead.
Pure: msgspec only (ktctl imports it, via ``ktd.protocol``).
"""

from __future__ import annotations

import msgspec

from ktd import foreign


def _family(first: int, kind: str, widths: tuple[int, ...]) -> dict[int, tuple[str, int]]:
    """One kind's header bytes: msgpack numbers a kind's widths with consecutive bytes."""
    return {first + i: (kind, width) for i, width in enumerate(widths)}


#: The msgpack header bytes whose size is not in the byte itself: ``("fixed", n)`` is
#: followed by n bytes of value; any other kind by its length in the next ``width``
#: bytes (big-endian), then that many bytes (``str``, ``skip`` for bin, ``ext`` after a
#: type byte) or items (``array``, ``map``).
_HEADERS: dict[int, tuple[str, int]] = {
    **_family(0xCC, "fixed", (1, 2, 4, 8)),  # uint 8 .. 64
    **_family(0xD0, "fixed", (1, 2, 4, 8)),  # int 8 .. 64
    **_family(0xCA, "fixed", (4, 8)),  # float 32, 64
    **_family(0xD4, "fixed", (2, 3, 5, 9, 17)),  # fixext 1 .. 16, after a type byte
    **_family(0xD9, "str", (1, 2, 4)),
    **_family(0xC4, "skip", (1, 2, 4)),  # bin
    **_family(0xC7, "ext", (1, 2, 4)),
    **_family(0xDC, "array", (2, 4)),
    **_family(0xDE, "map", (2, 4)),
}


def _valid_id(rid: object) -> int | None:
    if isinstance(rid, int) and not isinstance(rid, bool) and -(2**63) <= rid < 2**64:
        return rid
    return None


def skim_id(data: bytes, *, max_keys: int = 64) -> int:
    """The request id of a frame too big to decode, read without decoding it.

    Walks only the top-level msgpack map: each key is read, each value is skipped by
    the length in its header (so a 1 MiB string costs nothing), nested containers are
    not entered unless they come before ``id`` (then up to ``max_keys`` items in all).
    ktctl and the frontend encode ``op`` then ``id`` first, so the id is found in a few
    bytes. 0 when it cannot be found cheaply; the reply then carries id 0.
    """
    try:
        return _Skimmer(data, max_keys).find_id()
    except (IndexError, ValueError):  # msgspec.DecodeError is a ValueError
        return 0


class _Skimmer:
    def __init__(self, data: bytes, budget: int) -> None:
        self.data = data
        self.pos = 0
        self.budget = budget

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise IndexError("short")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _uint(self, n: int) -> int:
        return int.from_bytes(self._take(n), "big")

    def _header(self) -> tuple[str, int]:
        """(kind, n): kind is 'map'/'array' (n items), 'skip' (n bytes), or 'str'."""
        b = self._take(1)[0]
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            return "skip", 0
        if 0x80 <= b <= 0x8F:
            return "map", b & 0x0F
        if 0x90 <= b <= 0x9F:
            return "array", b & 0x0F
        if 0xA0 <= b <= 0xBF:
            return "str", b & 0x1F
        head = _HEADERS.get(b)
        if head is None:
            raise ValueError(f"bad msgpack byte {b:#x}")
        kind, width = head
        if kind == "fixed":
            return "skip", width
        n = self._uint(width)
        if kind == "ext":
            return "skip", n + 1
        return kind, n

    def _skip(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise ValueError("too many items")
        kind, n = self._header()
        if kind in ("skip", "str"):
            self._take(n)
        elif kind == "array":
            for _ in range(n):
                self._skip()
        elif kind == "map":
            for _ in range(2 * n):
                self._skip()

    def find_id(self) -> int:
        kind, n = self._header()
        if kind != "map":
            return 0
        for _ in range(min(n, self.budget)):
            key_at = self.pos
            kkind, klen = self._header()
            key = None
            if kkind == "str":
                key = self._take(klen)
            else:  # not a string key: rewind and skip it whole
                self.pos = key_at
                self._skip()
            if key == b"id":
                start = self.pos
                self._skip()
                value = foreign.msgpack_any(self.data[start : self.pos])
                return _valid_id(value) or 0
            self._skip()
        return 0


def peek_id(data: bytes) -> int:
    """Best-effort request id of a frame that failed to decode, so the error reply matches."""
    try:
        obj = foreign.msgpack_any(data)
    except msgspec.DecodeError:
        return 0
    if isinstance(obj, dict):
        return _valid_id(obj.get("id")) or 0
    return 0
