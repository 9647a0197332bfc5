"""Decoding what others wrote (``ktd.foreign``, issue 43): the depth scanners agree with
the nesting of the values they scan, and every decoder of foreign bytes (the control
protocol's requests, replies and events, JSON) raises ``msgspec.DecodeError`` and nothing
else, whatever the depth, size or type of any field of any message."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from ktd import foreign, protocol_schema
from ktd import protocol as p
from ktd.frameid import skim_id
from tests.hypo import budget

# ---------------------------------------------------------------- the scanners


def depth_of(value: Any) -> int:
    """The reference: how deep arrays and objects nest (a scalar is 0)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


# Strings that look like structure to a careless scanner: brackets, quotes, escapes,
# and (in msgpack) bytes that are container headers.
tricky = st.one_of(
    st.text(alphabet='[]{}"\\,: \x90\x91\x80\x81\xdc\xdea', max_size=12),
    st.sampled_from(["\\", '\\"', "\\\\", '"[', '\\\\"{', "]]]", "{{{"]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), tricky)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(tricky, inner, max_size=4)
    ),
    max_leaves=40,
)


@budget(200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=values, limit=st.integers(0, 12))
def test_the_scanners_measure_the_depth_a_decoder_would_recurse_to(value: Any, limit: int) -> None:
    deep = depth_of(value) > limit
    for check, data in (
        (foreign.check_msgpack, msgspec.msgpack.encode(value)),
        (foreign.check_json, msgspec.json.encode(value)),
        (foreign.check_json, json.dumps(value)),  # the standard library's escapes, as str
    ):
        if deep:
            with pytest.raises(foreign.TooDeep):
                check(data, limit)
        else:
            check(data, limit)


def nested(depth: int, kind: str = "array") -> bytes:
    """msgpack: ``depth`` containers, one in the other (in every header width)."""
    head = {"array": b"\x91", "map": b"\x81\xa1k", "array16": b"\xdc\x00\x01"}[kind]
    return head * depth + b"\xc0"


@pytest.mark.parametrize("kind", ["array", "map", "array16"])
def test_the_limit_is_exact_and_the_same_wherever_it_is_called_from(kind: str) -> None:
    foreign.check_msgpack(nested(foreign.MAX_DEPTH, kind))
    with pytest.raises(foreign.TooDeep, match="nested more than 128 levels deep"):
        foreign.check_msgpack(nested(foreign.MAX_DEPTH + 1, kind))
    assert foreign.msgpack_any(nested(foreign.MAX_DEPTH, kind)) is not None
    foreign.check_json("[" * 128 + "]" * 128)
    with pytest.raises(foreign.TooDeep):
        foreign.check_json("[" * 129 + "]" * 129)


def test_a_decoder_that_recurses_past_pythons_limit_still_raises_a_decode_error() -> None:
    """The last resort: a limit above what Python can recurse to (so the scan lets it
    through) and the decoder's own RecursionError comes out as ``Malformed``."""
    data = nested(5000)
    with pytest.raises(foreign.Malformed, match="nested too deeply"):
        foreign.msgpack_any(data, limit=10_000)
    with pytest.raises(foreign.Malformed, match="nested too deeply"):
        foreign.json_any("[" * 5000 + "]" * 5000, limit=10_000)
    with pytest.raises(foreign.Malformed, match="nested too deeply"):
        foreign.loads("[" * 5000 + "]" * 5000, limit=10_000)


def test_a_decoders_surprise_is_malformed_input() -> None:
    class Odd(msgspec.Struct):
        x: int

        def __post_init__(self) -> None:
            raise KeyError(self.x)  # neither ValueError nor TypeError: msgspec passes it on

    with pytest.raises(foreign.Malformed, match="KeyError"):
        foreign.json(b'{"x": 1}', msgspec.json.Decoder(Odd))
    with pytest.raises(foreign.Malformed, match="KeyError"):
        foreign.msgpack(msgspec.msgpack.encode({"x": 1}), msgspec.msgpack.Decoder(Odd))


def test_malformed_is_what_callers_already_refuse() -> None:
    assert issubclass(foreign.TooDeep, msgspec.DecodeError)
    assert issubclass(foreign.Malformed, ValueError)
    with pytest.raises(json.JSONDecodeError):  # the standard library's, with its position
        foreign.loads("[1,")


# ---------------------------------------------------------------- every message


EXAMPLES = protocol_schema.examples(protocol_schema.current())
DECODE = {"request": p.decode_request, "reply": p.decode_reply, "event": p.decode_event}


def test_the_examples_cover_every_request_reply_and_event() -> None:
    tags = {str(ex["message"].get("op") or ex["message"].get("type")) for ex in EXAMPLES}
    ops = {str(t.__struct_config__.tag) for t in p.AnyRequest.__args__}
    types = {str(t.__struct_config__.tag) for t in p.AnyReply.__args__}
    assert ops | types <= tags
    assert {ex["kind"] for ex in EXAMPLES} == {"request", "reply", "event"}


def frame(message: dict[str, Any], field: str, raw: bytes) -> bytes:
    """``message`` as msgpack with ``field``'s value (set or added) replaced by ``raw``,
    bytes no encoder would write (msgspec refuses to encode 1,000 levels)."""
    items = {k: msgspec.msgpack.encode(v) for k, v in message.items()}
    items[field] = raw
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(msgspec.msgpack.encode(k) + v for k, v in items.items())


ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, -1, 2**32, 2**53 + 1, 2**63, 2**64 - 1, -(2**63)]),
)
hostile_values = st.one_of(
    values,
    ints,
    st.text(max_size=3000),
    st.binary(max_size=3000),
    st.lists(st.integers(0, 9), min_size=0, max_size=5000),
    st.dictionaries(st.text(max_size=4), ints, max_size=300),
)


@st.composite
def hostile_frames(draw: st.DrawFn) -> tuple[str, bytes, int, int]:
    """(kind, frame, depth of what was put in, the message's id): one message of the
    protocol with one field (its own, or one it does not know) nested to any depth in
    any header width, or given any value of any type and size."""
    example = draw(st.sampled_from(EXAMPLES))
    rid = draw(st.integers(0, 2**31))
    message = {"id": rid, **{k: v for k, v in example["message"].items() if k != "id"}}
    field = draw(st.sampled_from([*sorted(message), "pad", "zz_newer"]))
    if field == "id":
        rid = 0
    if draw(st.booleans()):
        depth = draw(st.one_of(st.integers(1, 300), st.integers(300, 20_000)))
        kind = draw(st.sampled_from(["array", "map", "array16"]))
        return example["kind"], frame(message, field, nested(depth, kind)), depth, rid
    value = draw(hostile_values)
    return example["kind"], frame(message, field, msgspec.msgpack.encode(value)), 0, rid


@budget(
    300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(case=hostile_frames())
def test_every_message_with_any_field_of_any_depth_size_and_type_decodes_or_is_refused(
    case: tuple[str, bytes, int, int],
) -> None:
    kind, data, depth, rid = case
    try:
        DECODE[kind](data)
    except msgspec.DecodeError as exc:
        if depth + 1 > foreign.MAX_DEPTH:  # the message's own map is one level
            assert isinstance(exc, foreign.TooDeep)
    else:
        assert depth + 1 <= foreign.MAX_DEPTH
    # The id a refusal carries is still read (ktd answers a client by it).
    if kind == "request" and rid and len(data) <= p.MAX_FRAME:
        assert skim_id(data) == rid


def test_a_1000_deep_field_is_too_deep_in_every_request() -> None:
    """The issue's frame: ``{"op": ..., "id": 1, "pad": [[[...]]]}``, for every op."""
    for ex in EXAMPLES:
        if ex["kind"] != "request":
            continue
        data = frame({**ex["message"], "id": 1}, "pad", nested(1000))
        with pytest.raises(foreign.TooDeep):
            p.decode_request(data)
        assert skim_id(data) == 1
