"""Protocol: numbers are validated at decode, and an oversized frame's id is recoverable."""

from __future__ import annotations

import math

import msgspec
import pytest

from ktd import protocol as p


@pytest.mark.parametrize("op", ["load", "evict", "acquire"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, -1e-9, 1e10])
def test_bad_timeouts_do_not_decode(op: str, bad: float) -> None:
    fields = {
        "load": {"alias": "a"},
        "evict": {"alias": "a"},
        "acquire": {"model": "a", "client": "c"},
    }[op]
    data = msgspec.msgpack.encode({"op": op, "id": 3, "timeout": bad, **fields})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.timeout"):
        p.decode_request(data)
    assert p.peek_id(data) == 3


def test_good_timeouts_and_line_counts() -> None:
    for t in (None, 0, 0.5, 3600):
        req = p.decode_request(p.encode(p.Load(alias="a", timeout=t)))
        assert isinstance(req, p.Load) and req.timeout == t
    with pytest.raises(msgspec.ValidationError, match=r"\$\.lines"):
        p.decode_request(msgspec.msgpack.encode({"op": "logs", "alias": "a", "lines": -5}))


def test_skim_id_of_an_oversized_frame() -> None:
    big = p.encode(p.Load(id=1234567, alias="x" * (p.MAX_FRAME + 10)))
    assert len(big) > p.MAX_FRAME and p.skim_id(big) == 1234567
    # id after a huge field and a nested one: found by skipping, not decoding.
    data = msgspec.msgpack.encode(
        {"pad": "y" * (2 << 20), "n": [1, {"a": b"z" * 300}], 7: 1.5, "id": 41, "op": "ping"}
    )
    assert p.skim_id(data) == 41
    assert p.skim_id(msgspec.msgpack.encode({"op": "ping", "id": -9})) == -9
    for junk in (
        b"",
        b"\xc1" * 100,
        msgspec.msgpack.encode([1, 2]),
        b"\x81\xa2id",
        msgspec.msgpack.encode({"id": "7"}),
        msgspec.msgpack.encode({"id": True}),
    ):
        assert p.skim_id(junk) == 0
