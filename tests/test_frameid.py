"""The id of a frame the daemon will not decode (``ktd.frameid``): every msgpack header
whose size is not in its first byte is stepped over by the right number of bytes."""

from __future__ import annotations

import struct

import msgspec
import pytest

from ktd.frameid import _HEADERS, _family, skim_id


def test_family_numbers_a_kinds_widths_with_consecutive_bytes() -> None:
    assert _family(0xDC, "array", (2, 4)) == {0xDC: ("array", 2), 0xDD: ("array", 4)}
    assert _family(0x10, "fixed", ()) == {}


def test_the_families_do_not_overlap() -> None:
    # 9 families, 28 bytes: a byte claimed twice would have lost one of its meanings.
    assert len(_HEADERS) == 4 + 4 + 2 + 5 + 3 + 3 + 3 + 2 + 2


def _packed(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


# One value of each header that carries its size after the first byte, as msgspec
# writes it (the first byte checked, so the case tests the header it names).
CASES = [
    (0xCC, 200),
    (0xCD, 60_000),
    (0xCE, 4_000_000_000),
    (0xCF, 2**64 - 1),
    (0xD0, -100),
    (0xD1, -30_000),
    (0xD2, -2_000_000_000),
    (0xD3, -(2**63)),
    (0xCB, 1.5),
    (0xD4, msgspec.msgpack.Ext(1, b"a")),
    (0xD5, msgspec.msgpack.Ext(1, b"ab")),
    (0xD6, msgspec.msgpack.Ext(1, b"abcd")),
    (0xD7, msgspec.msgpack.Ext(1, b"abcdefgh")),
    (0xD8, msgspec.msgpack.Ext(1, b"a" * 16)),
    (0xC7, msgspec.msgpack.Ext(1, b"abc")),
    (0xC8, msgspec.msgpack.Ext(1, b"a" * 300)),
    (0xC9, msgspec.msgpack.Ext(1, b"a" * 70_000)),
    (0xD9, "s" * 40),
    (0xDA, "s" * 300),
    (0xDB, "s" * 70_000),
    (0xC4, b"b" * 3),
    (0xC5, b"b" * 300),
    (0xC6, b"b" * 70_000),
    (0xDC, [1] * 20),
    (0xDD, [1] * 70_000),
    (0xDE, {str(i): i for i in range(20)}),
    (0xDF, {str(i): i for i in range(70_000)}),
]


@pytest.mark.parametrize(("first", "value"), CASES, ids=[f"{b:#x}" for b, _ in CASES])
def test_a_value_before_the_id_is_stepped_over(first: int, value: object) -> None:
    packed = _packed(value)
    assert packed[0] == first
    data = b"\x82" + _packed("pad") + packed + _packed("id") + _packed(4242)
    assert skim_id(data, max_keys=200_000) == 4242


def test_a_float32_before_the_id_is_stepped_over() -> None:
    # msgspec writes floats as float64; a client may write float32 (0xCA).
    data = b"\x82" + _packed("pad") + b"\xca" + struct.pack(">f", 1.5) + _packed("id") + b"\x07"
    assert skim_id(data) == 7
