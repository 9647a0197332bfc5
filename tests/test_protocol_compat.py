"""Protocol 1.1 against 1.0, in both directions, message by message.

Each version has a committed corpus (``docs/protocol/ktd-control-M.m.examples.json``:
every request, reply and event with every field set, and with only the required
ones). 1.0's types are its frozen module (``tests/fixtures/protocol_1_0.py``, de80b41's
``ktd/protocol.py``), so "an old peer" here is the old code's own decoder, not a guess:

* an old client, a new daemon: every 1.0 request decodes with today's types, every
  field kept; a new client, an old daemon: every 1.0 reply and event decodes with
  today's types (a 1.0 ``Pong`` reads as protocol 1.0);
* a new daemon, an old client: every 1.1 reply and event of a type 1.0 had decodes with
  1.0's types and is valid under 1.0's schema; a new client, an old daemon: every 1.1
  request of an op 1.0 had decodes with 1.0's types. A new op (the documented exception)
  fails 1.0's decoding at ``$.op`` with its id readable, so a 1.0 daemon answers it
  ``bad_request`` with the request's id;
* a newer peer (1.2): unknown fields are ignored, and new values of the open
  vocabularies (states, error codes, recall kinds) decode.
"""

from __future__ import annotations

import typing
from types import ModuleType
from typing import Any

import jsonschema
import msgspec
import pytest

from ktd import protocol as p
from ktd.frameid import peek_id
from tests.test_protocol_schema import committed, protocol_1_0, protocol_1_1

#: Tags 1.1 added: a new client sends these ops only to a daemon whose ``Pong`` says
#: 1.1 or later (or whose features name them), and only those replies answer them.
NEW_OPS_1_1 = {
    "schema",
    "engine_memory",
    "config_get",
    "config_plan",
    "config_apply",
    "config_history",
    "config_rollback",
}
NEW_REPLIES_1_1 = {
    "schema",
    "engine_memory",
    "config",
    "config_plan",
    "config_apply",
    "config_history",
}


#: Tags 1.2 added (the model catalog and the pull jobs, issue 44); the event gained ``pull``.
NEW_OPS_1_2 = {"catalog", "pull", "pulls", "pull_cancel"}
NEW_REPLIES_1_2 = {"catalog", "pull", "pulls"}


def tags(union: Any) -> set[str]:
    return {str(c.__struct_config__.tag) for c in typing.get_args(union)}


def corpus(version: str, kind: str) -> list[dict[str, Any]]:
    return [ex for ex in committed(version, ".examples") if ex["kind"] == kind]


def tag_of(ex: dict[str, Any]) -> str | None:
    message: dict[str, Any] = ex["message"]
    return message.get("op", message.get("type"))


def decoder(module: ModuleType, kind: str) -> msgspec.msgpack.Decoder[Any]:
    union = {"request": module.AnyRequest, "reply": module.AnyReply, "event": module.Event}[kind]
    return msgspec.msgpack.Decoder(union)


def kept(message: dict[str, Any], decoded: Any, *, older: bool = False) -> None:
    """Every field the sender set arrived with its value (wire names, nested too); to an
    ``older`` receiver, every field it knows (the others it ignores)."""
    same(message, msgspec.to_builtins(decoded), older=older, at="$")


def same(sent: Any, got: Any, *, older: bool, at: str) -> None:
    if isinstance(sent, dict):
        assert isinstance(got, dict), at
        for key, value in sent.items():
            if key not in got:
                assert older, f"{at}.{key} was lost"
                continue
            same(value, got[key], older=older, at=f"{at}.{key}")
    elif isinstance(sent, list):
        assert isinstance(got, list) and len(got) == len(sent), at
        for i, (a, b) in enumerate(zip(sent, got, strict=True)):
            same(a, b, older=older, at=f"{at}[{i}]")
    elif isinstance(sent, float) or isinstance(got, float):
        assert got == pytest.approx(sent), at
    else:
        assert got == sent, (at, got, sent)


def test_the_new_tags_are_exactly_1_1_s_and_1_2_s_additions() -> None:
    old, mid = protocol_1_0(), protocol_1_1()
    assert tags(mid.AnyRequest) - tags(old.AnyRequest) == NEW_OPS_1_1
    assert tags(mid.AnyReply) - tags(old.AnyReply) == NEW_REPLIES_1_1
    assert tags(p.AnyRequest) - tags(mid.AnyRequest) == NEW_OPS_1_2
    assert tags(p.AnyReply) - tags(mid.AnyReply) == NEW_REPLIES_1_2
    assert tags(mid.AnyRequest) <= tags(p.AnyRequest)
    assert tags(mid.AnyReply) <= tags(p.AnyReply)
    # Nothing is ever removed in a minor.
    assert tags(old.AnyRequest) <= tags(p.AnyRequest)
    assert tags(old.AnyReply) <= tags(p.AnyReply)


@pytest.mark.parametrize("kind", ["request", "reply", "event"])
def test_every_1_0_message_decodes_with_today_s_types(kind: str) -> None:
    """An old client's requests reach a new daemon, an old daemon's replies and events
    reach a new client, with every field."""
    today = decoder(p, kind)
    for ex in corpus("1.0", kind):
        decoded = today.decode(msgspec.msgpack.encode(ex["message"]))
        assert type(decoded).__name__ == ex["name"].split(" ")[0]
        kept(ex["message"], decoded)


def test_a_1_0_pong_reads_as_protocol_1_0_without_features() -> None:
    [pong] = [ex for ex in corpus("1.0", "reply") if ex["name"] == "Pong"]
    got = p.decode_reply(msgspec.msgpack.encode(pong["message"]))
    assert isinstance(got, p.Pong)
    assert got.protocol == p.PROTOCOL_1_0 and str(got.protocol) == "1.0" and got.features == []


@pytest.mark.parametrize("kind", ["request", "reply", "event"])
def test_every_1_1_message_an_old_peer_knows_decodes_with_1_0_s_types(kind: str) -> None:
    """A new daemon's replies and events reach an old client; a new client's requests
    reach an old daemon: decoded by 1.0's own types and valid under 1.0's schema."""
    old = decoder(protocol_1_0(), kind)
    old_schema = jsonschema.Draft202012Validator(committed("1.0"))
    new = NEW_OPS_1_1 if kind == "request" else NEW_REPLIES_1_1 if kind == "reply" else set()
    checked = 0
    for ex in corpus("1.1", kind):
        if tag_of(ex) in new:
            continue
        old_schema.validate(ex["message"])
        decoded = old.decode(msgspec.msgpack.encode(ex["message"]))
        assert type(decoded).__name__ == ex["name"].split(" ")[0]
        kept(ex["message"], decoded, older=True)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("kind", ["request", "reply", "event"])
def test_every_1_2_message_a_1_1_peer_knows_decodes_with_1_1_s_types(kind: str) -> None:
    """1.2 against 1.1 as 1.1 against 1.0: the old peer's own decoder and schema."""
    old = decoder(protocol_1_1(), kind)
    old_schema = jsonschema.Draft202012Validator(committed("1.1"))
    new = NEW_OPS_1_2 if kind == "request" else NEW_REPLIES_1_2 if kind == "reply" else set()
    checked = 0
    for ex in corpus("1.2", kind):
        if tag_of(ex) in new:
            continue
        message = {k: v for k, v in ex["message"].items() if k != "pull"}  # the event's new field
        old_schema.validate(message)
        decoded = old.decode(msgspec.msgpack.encode(ex["message"]))
        assert type(decoded).__name__ == ex["name"].split(" ")[0]
        kept(ex["message"], decoded, older=True)
        checked += 1
    assert checked > 0


def test_a_pull_sent_to_a_1_1_daemon_is_refused_with_its_id() -> None:
    old = protocol_1_1()
    for ex in corpus("1.2", "request"):
        if tag_of(ex) not in NEW_OPS_1_2:
            continue
        data = msgspec.msgpack.encode(ex["message"])
        with pytest.raises(msgspec.ValidationError, match=r"\$\.op"):
            old.decode_request(data)
        assert peek_id(data) == ex["message"].get("id", 0)


def test_a_new_op_sent_to_a_1_0_daemon_is_refused_with_its_id() -> None:
    """What a 1.0 daemon did with a frame it could not decode (server.py at de80b41):
    ``bad_request``, with the id ``peek_id`` reads, so the client is answered at once."""
    old = protocol_1_0()
    for ex in corpus("1.1", "request"):
        if tag_of(ex) not in NEW_OPS_1_1:
            continue
        data = msgspec.msgpack.encode(ex["message"])
        with pytest.raises(msgspec.ValidationError, match=r"\$\.op"):
            old.decode_request(data)
        assert peek_id(data) == ex["message"].get("id", 0)


def future(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as a newer minor might send it: fields nobody knows yet, also nested."""
    out = {**message, "zz_future": {"nested": [1, "two"]}, "zz_flag": True}
    for key in ("engine", "engines", "holders", "recalls", "rows"):
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {**value, "zz_future": 1}
        elif isinstance(value, list):
            out[key] = [{**v, "zz_future": 1} if isinstance(v, dict) else v for v in value]
    return out


@pytest.mark.parametrize("kind", ["request", "reply", "event"])
def test_a_newer_minor_s_unknown_fields_are_ignored(kind: str) -> None:
    today = decoder(p, kind)
    for ex in corpus("1.1", kind):
        decoded = today.decode(msgspec.msgpack.encode(future(ex["message"])))
        kept(ex["message"], decoded)
        assert "zz_future" not in msgspec.to_builtins(decoded)


def test_a_state_a_newer_daemon_adds_decodes_today_and_failed_1_0() -> None:
    """The rule "clients tolerate new values" (docs/protocol.md) holds from 1.1 on: 1.0's
    types decoded the state as an enum, so a new state was a ProtocolError there."""
    engine = {"alias": "m", "state": "hibernating", "pid": 7}
    status = msgspec.msgpack.encode({"type": "status", "id": 3, "engines": [engine]})
    reply = p.decode_reply(status)
    assert isinstance(reply, p.StatusReply) and reply.engines[0].state == "hibernating"
    event = {"topic": "engine.m", "time": 1.0, "alias": "m", "state": "hibernating"}
    assert p.decode_event(msgspec.msgpack.encode(event)).state == "hibernating"
    holder = {"type": "machine", "holders": [{"alias": "m", "state": "hibernating"}]}
    machine = p.decode_reply(msgspec.msgpack.encode(holder))
    assert isinstance(machine, p.MachineReply) and machine.holders[0].state == "hibernating"
    error = {"type": "error", "code": "a_newer_code", "message": "m"}
    assert p.decode_reply(msgspec.msgpack.encode(error)) == p.Error(
        code="a_newer_code", message="m"
    )
    old = protocol_1_0()
    with pytest.raises(msgspec.ValidationError, match="state"):
        old.decode_reply(status)


def test_an_array_like_struct_may_gain_trailing_fields() -> None:
    """``Limits`` travels as an array: a newer daemon's longer one still decodes."""
    data = msgspec.msgpack.encode({"type": "sync", "limits": {"m": [4, 8, "later"]}})
    reply = p.decode_reply(data)
    assert isinstance(reply, p.SyncReply)
    assert reply.limits["m"] == p.Limits(max_concurrent=4, max_queue=8)
