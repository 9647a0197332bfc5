"""The control server's dispatch, against a fake pool: ``sleep``/``wake`` (issue 28),
each answered with a ``load`` reply in a task of its own, the pool's errors keeping
their stable codes on the wire; the protocol's version, features and schema (issue
37), and what a frame that is no request of this daemon's gets."""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio
import zmq

from ktd import protocol as p
from ktd import protocol_schema
from ktd.control.aclient import AsyncClient
from ktd.control.errors import ControlError
from ktd.daemon.config.desk import Who
from ktd.daemon.pool.controls import Controls
from ktd.daemon.server import ControlServer


class FakePool:
    """Only what the server calls for these requests; ``gate`` holds a sleep until set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float | None]] = []
        self.gate = trio.Event()
        self.gate.set()

    def _check(self, alias: str) -> None:
        if alias == "x":
            raise ControlError(
                p.ErrorCode.NO_SLEEP,
                "x cannot sleep: models.json does not set sleep",
                {"sleep": "off"},
            )
        if alias != "m":
            raise ControlError(p.ErrorCode.UNKNOWN_MODEL, f"unknown model {alias!r}")

    async def sleep(self, alias: str, *, timeout: float | None = None) -> p.EngineInfo:
        self.calls.append(("sleep", alias, timeout))
        self._check(alias)
        await self.gate.wait()
        return p.EngineInfo(alias=alias, state="asleep", sleep="on", host_bytes=1 << 30)

    async def wake(self, alias: str, *, timeout: float | None = None) -> p.EngineInfo:
        self.calls.append(("wake", alias, timeout))
        self._check(alias)
        if timeout == 1:
            raise ControlError(p.ErrorCode.TIMEOUT, f"{alias} not ready after 1s")
        return p.EngineInfo(alias=alias, state="ready", url="http://127.0.0.1:30000")

    def status(self, alias: str | None = None) -> list[p.EngineInfo]:
        return []


async def _unused() -> Any:
    raise AssertionError("not called by these tests")


@asynccontextmanager
async def serving(tmp_path: Path, pool: FakePool, config: Any = None) -> AsyncIterator[AsyncClient]:
    async with serving_at(tmp_path, pool, config) as (client, _endpoint):
        yield client


@asynccontextmanager
async def serving_at(
    tmp_path: Path, pool: FakePool, config: Any = None
) -> AsyncIterator[tuple[AsyncClient, str]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    control = ctx.socket(zmq.ROUTER)
    events = ctx.socket(zmq.XPUB)
    for s in (control, events):
        s.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/c.sock"
    control.bind(endpoint)
    events.bind(f"ipc://{tmp_path}/e.sock")
    server = ControlServer(
        cast(Controls, pool),
        control,
        events,
        reload=_unused,
        doctor=_unused,
        dry_run=lambda alias: _unused(),
        shutdown=lambda: None,
        config=config,
    )
    client = AsyncClient(endpoint, timeout=10)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            await nursery.start(client.run)
            yield client, endpoint
            nursery.cancel_scope.cancel()
    finally:
        server.close()


async def test_sleep_and_wake_answer_with_the_engine(tmp_path: Path) -> None:
    pool = FakePool()
    async with serving(tmp_path, pool) as client:
        reply = await client.request(p.Sleep(alias="m", timeout=30), timeout=math.inf)
        assert isinstance(reply, p.LoadReply)
        assert (reply.engine.state, reply.engine.host_bytes) == ("asleep", 1 << 30)
        reply = await client.request(p.Wake(alias="m"), timeout=math.inf)
        assert isinstance(reply, p.LoadReply)
        assert (reply.engine.state, reply.engine.url) == ("ready", "http://127.0.0.1:30000")
    assert pool.calls == [("sleep", "m", 30.0), ("wake", "m", None)]


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (p.Sleep(alias="x"), "no_sleep"),
        (p.Wake(alias="x"), "no_sleep"),
        (p.Sleep(alias="nope"), "unknown_model"),
        (p.Wake(alias="m", timeout=1), "timeout"),
    ],
)
async def test_the_pools_errors_keep_their_codes(tmp_path: Path, msg: p.Request, code: str) -> None:
    async with serving(tmp_path, FakePool()) as client:
        with pytest.raises(ControlError) as info:
            await client.request(msg)
    assert info.value.code == code
    if code == "no_sleep":
        assert info.value.message == "x cannot sleep: models.json does not set sleep"
        assert info.value.detail == {"sleep": "off"}


async def test_a_sleep_waits_in_a_task_of_its_own(tmp_path: Path) -> None:
    """A long sleep (the drain) blocks neither the socket nor other requests."""
    pool = FakePool()
    pool.gate = trio.Event()
    async with serving(tmp_path, pool) as client:
        replies: list[p.Reply] = []

        async def sleep() -> None:
            replies.append(await client.request(p.Sleep(alias="m"), timeout=math.inf))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleep)
            with trio.fail_after(5):
                while not pool.calls:
                    await trio.sleep(0.01)
            assert isinstance(await client.request(p.Ping()), p.Pong)
            woken = await client.request(p.Wake(alias="m"))
            assert isinstance(woken, p.LoadReply) and not replies
            pool.gate.set()
        assert isinstance(replies[0], p.LoadReply) and replies[0].engine.state == "asleep"


async def test_a_too_long_alias_is_a_bad_request(tmp_path: Path) -> None:
    pool = FakePool()
    async with serving(tmp_path, pool) as client:
        for msg in (p.Sleep(alias="m" * 300), p.Wake(alias="m" * 300)):
            with pytest.raises(ControlError) as info:
                await client.request(msg)
            assert info.value.code == "bad_request"
    assert pool.calls == []


async def raw(endpoint: str, payload: bytes) -> p.Reply:
    """Send one frame as any client might (no ``ktd.protocol`` encoder), read its reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(payload)
        with trio.fail_after(5):
            while not sock.poll(0):
                await trio.sleep(0.01)
        return p.decode_reply(sock.recv())
    finally:
        sock.close()


async def test_ping_says_the_protocol_and_its_features(tmp_path: Path) -> None:
    async with serving(tmp_path, FakePool()) as client:
        pong = await client.request(p.Ping())
    assert isinstance(pong, p.Pong)
    assert pong.protocol == p.PROTOCOL and str(pong.protocol) == "1.2"
    assert pong.features == list(p.FEATURES)
    assert {"sleep", "usage", "keys", "schema"} <= set(pong.features)


async def test_the_schema_request_answers_the_committed_document(tmp_path: Path) -> None:
    async with serving(tmp_path, FakePool()) as client:
        reply = await client.request(p.Schema())
    assert isinstance(reply, p.SchemaReply) and reply.protocol == p.PROTOCOL
    assert reply.schema == protocol_schema.document()
    committed = protocol_schema.DOCS / f"ktd-control-{p.PROTOCOL}.json"
    assert protocol_schema.dumps(reply.schema) == committed.read_text()


async def test_an_unknown_op_is_a_bad_request_naming_it_and_the_protocol(tmp_path: Path) -> None:
    """A newer client's new request, sent to this daemon: ``bad_request`` with the op in
    ``detail.unknown_op`` (the client may fall back), answered with its id."""
    async with serving_at(tmp_path, FakePool()) as (_client, endpoint):
        frame = msgspec.msgpack.encode({"op": "plan_config", "id": 17, "changes": [1]})
        reply = await raw(endpoint, frame)
    assert isinstance(reply, p.Error) and reply.code == "bad_request" and reply.id == 17
    assert reply.detail == {"unknown_op": "plan_config", "protocol": "1.2"}
    assert "unknown op 'plan_config'" in reply.message


async def test_a_newer_minor_s_request_with_unknown_fields_is_served(tmp_path: Path) -> None:
    async with serving_at(tmp_path, FakePool()) as (_client, endpoint):
        frame = msgspec.msgpack.encode(
            {"op": "ping", "id": 5, "client_protocol": {"major": 1, "minor": 9}, "zz": [1]}
        )
        reply = await raw(endpoint, frame)
    assert isinstance(reply, p.Pong) and reply.id == 5


@pytest.mark.parametrize(
    ("frame", "rid", "says"),
    [
        # Cut short: its id (written first, as a client may) is still read.
        (msgspec.msgpack.encode({"id": 12, "op": "status", "alias": "m"})[:-3], 12, "malformed"),
        (b"\xc1\xc1garbage", 0, "malformed"),
        (msgspec.msgpack.encode([1, 2, 3]), 0, "malformed"),
        # A known op with a field of the wrong type: not an unknown op.
        (msgspec.msgpack.encode({"op": "load", "id": 3, "alias": 7}), 3, "$.alias"),
        (msgspec.msgpack.encode({"op": 5, "id": 4}), 4, "malformed"),
    ],
)
async def test_a_frame_that_is_no_request_gets_a_bad_request(
    tmp_path: Path, frame: bytes, rid: int, says: str
) -> None:
    async with serving_at(tmp_path, FakePool()) as (client, endpoint):
        reply = await raw(endpoint, frame)
        assert isinstance(await client.request(p.Ping()), p.Pong)  # still serving
    assert isinstance(reply, p.Error) and reply.code == "bad_request"
    assert reply.id == rid and says in reply.message and "unknown_op" not in reply.detail


class FakeDesk:
    """The config requests' one operation each, recording who the server said asked."""

    def __init__(self) -> None:
        self.who: list[Who] = []

    async def apply(
        self, config: str | None, models: str | None, base: str, who: Who
    ) -> p.ConfigApplyReply:
        self.who.append(who)
        if base == "dead":
            raise ControlError(p.ErrorCode.STALE_CONFIG, "the config changed since version dead")
        plan = p.ConfigPlanView(base=base, version="new", summary="update: a (ttl)")
        return p.ConfigApplyReply(plan=plan, version="new", seq=2)

    async def history_now(self) -> p.ConfigHistoryReply:
        return p.ConfigHistoryReply(keep=21, running="new", disk="new")


async def test_config_requests_carry_the_uid_the_socket_shows(tmp_path: Path) -> None:
    """The uid is the kernel's (SO_PEERCRED through libzmq's Peer-Address), not the
    client's word; the author the client names is passed on as claimed."""
    desk = FakeDesk()
    async with serving(tmp_path, FakePool(), config=desk) as client:
        msg = p.ConfigApply(models_text="[]", base="abc", author="mallory")
        reply = await client.request(msg, timeout=math.inf)
        assert isinstance(reply, p.ConfigApplyReply) and reply.seq == 2
        with pytest.raises(ControlError) as info:
            await client.request(p.ConfigApply(models_text="[]", base="dead"))
        assert info.value.code == "stale_config"
        history = await client.request(p.ConfigHistory())
        assert isinstance(history, p.ConfigHistoryReply) and history.keep == 21
    assert [(w.uid, w.claimed) for w in desk.who] == [(os.getuid(), "mallory"), (os.getuid(), "")]


def _padded(fields: dict[str, Any], pad: bytes) -> bytes:
    """``fields`` and a ``pad`` field whose value is ``pad``'s raw msgpack."""
    head = bytes([0x80 | (len(fields) + 1)])
    enc = msgspec.msgpack.encode
    body = b"".join(enc(k) + enc(v) for k, v in fields.items())
    return head + body + enc("pad") + pad


async def test_a_frame_nested_too_deeply_in_any_op_is_a_bad_request_and_ktd_serves_on(
    tmp_path: Path,
) -> None:
    """Issue 43: 1,000 nested arrays in a field of any op (1 KB) raised RecursionError
    out of the decoder, through the pump, into the daemon's nursery. Now each is a
    ``bad_request`` with its id, and the next request is served."""
    ops = sorted(str(t.__struct_config__.tag) for t in p.AnyRequest.__args__)
    async with serving_at(tmp_path, FakePool()) as (client, endpoint):
        for rid, op in enumerate(ops, 1):
            for deep in (b"\x91" * 1000 + b"\xc0", b"\x81\xa1k" * 129 + b"\xc0"):
                reply = await raw(endpoint, _padded({"op": op, "id": rid}, deep))
                assert isinstance(reply, p.Error), op
                assert (reply.code, reply.id) == ("bad_request", rid), op
                assert "nested more than 128 levels deep" in reply.message
        assert isinstance(await client.request(p.Ping()), p.Pong)
