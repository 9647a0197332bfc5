"""Protocol: numbers are validated at decode, and an oversized frame's id is recoverable."""

from __future__ import annotations

import math
import typing
from typing import Any

import msgspec
import pytest

from ktd import protocol as p
from ktd.frameid import peek_id, skim_id


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
    assert peek_id(data) == 3


def test_good_timeouts_and_line_counts() -> None:
    for t in (None, 0, 0.5, 3600):
        req = p.decode_request(p.encode(p.Load(alias="a", timeout=t)))
        assert isinstance(req, p.Load) and req.timeout == t
    with pytest.raises(msgspec.ValidationError, match=r"\$\.lines"):
        p.decode_request(msgspec.msgpack.encode({"op": "logs", "alias": "a", "lines": -5}))


def test_skim_id_of_an_oversized_frame() -> None:
    big = p.encode(p.Load(id=1234567, alias="x" * (p.MAX_FRAME + 10)))
    assert len(big) > p.MAX_FRAME and skim_id(big) == 1234567
    # id after a huge field and a nested one: found by skipping, not decoding.
    data = msgspec.msgpack.encode(
        {"pad": "y" * (2 << 20), "n": [1, {"a": b"z" * 300}], 7: 1.5, "id": 41, "op": "ping"}
    )
    assert skim_id(data) == 41
    assert skim_id(msgspec.msgpack.encode({"op": "ping", "id": -9})) == -9
    for junk in (
        b"",
        b"\xc1" * 100,
        msgspec.msgpack.encode([1, 2]),
        b"\x81\xa2id",
        msgspec.msgpack.encode({"id": "7"}),
        msgspec.msgpack.encode({"id": True}),
    ):
        assert skim_id(junk) == 0


def test_every_field_naming_a_model_has_the_name_limit() -> None:
    """A new request that names a model must carry the limit too (load, evict, status, logs,
    acquire, claim, and a claim holder's report); 256 characters decode, 257 do not."""
    import typing

    seen = []
    for cls in (*typing.get_args(p.AnyRequest), p.ClaimState):
        for field in msgspec.structs.fields(cls):
            if field.name in ("alias", "model"):
                seen.append(cls.__name__)
                info = msgspec.inspect.type_info(field.type)
                strs = (
                    [info]
                    if isinstance(info, msgspec.inspect.StrType)
                    else [
                        t
                        for t in getattr(info, "types", ())
                        if isinstance(t, msgspec.inspect.StrType)
                    ]
                )
                assert strs and all(t.max_length == p.MAX_MODEL_NAME for t in strs), cls
    assert sorted(seen) == sorted(
        [
            "Status",
            "Load",
            "Evict",
            "Sleep",
            "Wake",
            "Logs",
            "Acquire",
            "Claim",
            "ClaimState",
            "KeepAlive",
            "EngineMemory",
        ]
    )
    ok = msgspec.msgpack.encode({"op": "logs", "alias": "a" * p.MAX_MODEL_NAME})
    assert isinstance(p.decode_request(ok), p.Logs)
    for op in ("load", "evict", "sleep", "wake", "status", "logs", "engine_memory"):
        data = msgspec.msgpack.encode({"op": op, "alias": "a" * (p.MAX_MODEL_NAME + 1)})
        with pytest.raises(msgspec.ValidationError, match=r"length <= 256 - at `\$\.alias`"):
            p.decode_request(data)
    report = {"op": "sync", "client": "c", "queued": {"q" * 300: 1}}
    with pytest.raises(msgspec.ValidationError, match="length <= 256"):
        p.decode_request(msgspec.msgpack.encode(report))


def test_every_string_and_list_a_client_sends_is_bounded() -> None:
    """No field of a request is an unbounded string or list: a client cannot make the
    daemon hold megabytes per message (issue 32: 900 KB client ids grew it by 430 MB)."""
    import typing

    def unbounded(info: Any) -> bool:
        if isinstance(info, msgspec.inspect.UnionType):
            return any(unbounded(t) for t in info.types)
        if isinstance(info, (msgspec.inspect.StrType, msgspec.inspect.ListType)):
            inner = getattr(info, "item_type", None)
            return info.max_length is None or (inner is not None and unbounded(inner))
        if isinstance(info, msgspec.inspect.DictType):
            return info.max_length is None or unbounded(info.key_type)
        if isinstance(info, msgspec.inspect.StructType):
            return any(unbounded(f.type) for f in info.fields)
        return False

    for cls in typing.get_args(p.AnyRequest):
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            assert not unbounded(field.type), f"{cls.__name__}.{field.name}"
    for op in ("heartbeat", "sync"):
        data = msgspec.msgpack.encode({"op": op, "client": "c" * 900_000})
        with pytest.raises(msgspec.ValidationError, match=r"length <= 256 - at `\$\.client`"):
            p.decode_request(data)
    many = {"op": "sync", "client": "c", "claims": [{"claim": "x", "alias": "m"}] * 10_001}
    with pytest.raises(msgspec.ValidationError, match="length <= 10000"):
        p.decode_request(msgspec.msgpack.encode(many))


def test_a_claim_report_keeps_its_wire_name_for_requests_in_flight() -> None:
    """The code spells it ``in_flight``; the wire keeps ``inflight``, so frontends and
    daemons of the release before still understand each other."""
    state = p.ClaimState(claim="c", alias="m", in_flight=2)
    assert msgspec.to_builtins(state)["inflight"] == 2
    raw = msgspec.msgpack.encode({"op": "sync", "client": "f", "claims": [
        {"claim": "c", "alias": "m", "inflight": 3}
    ]})  # fmt: skip
    sync = p.decode_request(raw)
    assert isinstance(sync, p.Sync) and sync.claims[0].in_flight == 3


def test_status_and_lease_events_carry_in_flight_and_the_deprecated_leases_equal() -> None:
    """``leases`` is ``in_flight``'s old name, kept for one release for the scripts that
    read it: the same number under both, whichever the sender set (an older daemon
    sends only ``leases``)."""
    info = p.EngineInfo(alias="m", state=p.EngineState.READY, in_flight=3)
    assert msgspec.to_builtins(info)["in_flight"] == msgspec.to_builtins(info)["leases"] == 3
    old = msgspec.msgpack.encode({"type": "status", "engines": [
        {"alias": "m", "state": "ready", "leases": 2}
    ]})  # fmt: skip
    status = p.decode_reply(old)
    assert isinstance(status, p.StatusReply)
    assert (status.engines[0].in_flight, status.engines[0].leases) == (2, 2)
    assert p.EngineInfo(alias="m", state=p.EngineState.STOPPED).leases == 0

    event = p.Event(topic="lease.m", time=0.0, alias="m", in_flight=0)
    assert (event.in_flight, event.leases) == (0, 0)  # 0 is a count, not "not set"
    wire = p.decode_event(p.encode(event))
    assert (wire.in_flight, wire.leases) == (0, 0)
    old = msgspec.msgpack.encode({"topic": "lease.m", "time": 0.0, "alias": "m", "leases": 4})
    old_event = p.decode_event(old)
    assert (old_event.in_flight, old_event.leases) == (4, 4)
    assert p.Event(topic="engine.m", time=0.0, alias="m").in_flight is None


def test_every_request_is_paired_with_its_replies() -> None:
    """``p.REPLIES`` is the one request -> reply table (the schema's, every client's):
    every request has its line, every reply but ``Error`` answers some request, and
    ``replies_to`` adds ``Error``, which answers any."""
    assert set(p.REPLIES) == set(typing.get_args(p.AnyRequest))
    answering = {r for replies in p.REPLIES.values() for r in replies}
    assert answering == set(typing.get_args(p.AnyReply)) - {p.Error}
    assert p.replies_to(p.Load(alias="m", dry_run=True)) == (p.LoadReply, p.PlanReply, p.Error)
    assert p.replies_to(p.Sleep(alias="m")) == (p.LoadReply, p.Error)
