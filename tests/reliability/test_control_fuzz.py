"""Fuzzing the control socket: whatever clients send, ktd answers and nothing changes.

The control API's promise: "A malformed frame gets a ``bad_request`` reply (or is dropped when it
has no identity); the daemon never dies of a message." Hypothesis builds batches
of hostile messages (random bytes, valid requests with fields of the wrong type,
unknown ops, huge and truncated ints and lengths, deep nesting at the top and in any
field, frames over the 1 MiB limit, multipart garbage, empty frames); 20 DEALER clients
send a batch at
once, plus clients that hang up without reading and raw non-ZMTP garbage on the
unix socket. After every batch the daemon answers ``ping``, every message got
exactly one reply of the right kind, and ``status`` (a ready engine included) is
exactly what it was.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ktd import protocol as p
from ktd.frameid import peek_id, skim_id
from tests.conftest import ConfigWriter, sim_model
from tests.hypo import budget

from ._util import FAST_DAEMON, alive, status_view, wait_for

THREADS = 20
# Requests that decode but cannot change the daemon's state: the only valid
# requests a batch may contain, so that "status unchanged" is a real oracle.
SAFE = (p.Ping, p.Status, p.Models, p.Logs, p.Release, p.Heartbeat, p.Machine, p.Schema)
TAGS = {
    "ping",
    "schema",
    "status",
    "models",
    "load",
    "evict",
    "logs",
    "reload",
    "acquire",
    "release",
    "heartbeat",
    "doctor",
    "shutdown",
    "machine",
}


@dataclass(frozen=True)
class Msg:
    """One multipart message for a DEALER (the daemon's ROUTER adds the identity)."""

    frames: tuple[bytes, ...]
    kind: str

    def __repr__(self) -> str:
        shown = [f[:40] + (b"..." if len(f) > 40 else b"") for f in self.frames]
        sizes = [len(f) for f in self.frames]
        return f"Msg({self.kind}, sizes={sizes}, {shown!r})"

    @property
    def payload(self) -> bytes:
        return self.frames[-1]

    def expected(self) -> tuple[str, int]:
        """("bad_request", id) for what ktd cannot decode, ("answer", id) for the rest."""
        data = self.payload
        if len(data) > p.MAX_FRAME:
            return ("bad_request", skim_id(data))
        try:
            req = p.decode_request(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ("bad_request", peek_id(data) or skim_id(data))
        return ("answer", req.id)


def safe(msg: Msg) -> bool:
    """False for a message that would really load, evict, reload, lease or shut down."""
    if len(msg.payload) > p.MAX_FRAME:
        return True
    try:
        req = p.decode_request(msg.payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return True
    if isinstance(req, p.Load):
        return req.dry_run
    return isinstance(req, SAFE)


# ---------------------------------------------------------------- strategies

ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, -1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=30),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-5, 5)), inner, max_size=5),
    ),
    max_leaves=25,
)
BASES: list[dict[str, Any]] = [
    {"op": "ping"},
    {"op": "status"},
    {"op": "status", "alias": "fz-a"},
    {"op": "models"},
    {"op": "machine"},
    {"op": "logs", "alias": "fz-a", "lines": 5},
    {"op": "load", "alias": "fz-a", "dry_run": True},
    {"op": "release", "lease": "0123abcd"},
    {"op": "heartbeat", "client": "fuzzer"},
    # Mutations of these must be rejected; the un-mutated ones are filtered out.
    {"op": "load", "alias": "fz-b", "wait": False},
    {"op": "evict", "alias": "fz-a", "force": True},
    {"op": "evict", "all": True},
    {"op": "acquire", "model": "fz-a", "client": "fuzzer"},
    {"op": "reload"},
    {"op": "shutdown"},
    {"op": "doctor"},
]


def encode(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


@st.composite
def mutated_request(draw: st.DrawFn) -> Msg:
    req = dict(draw(st.sampled_from(BASES)))
    req["id"] = draw(ints)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["retype", "retype", "drop", "extra"]))
        if not req:
            how = "extra"
        key = draw(st.sampled_from(sorted(req))) if req else ""
        if how == "retype":
            req[key] = draw(values)
        elif how == "drop":
            req.pop(key, None)
        else:
            req[draw(st.text(max_size=12))] = draw(values)
    return Msg((encode(req),), "mutated")


@st.composite
def unknown_op(draw: st.DrawFn) -> Msg:
    op = draw(st.one_of(st.text(max_size=20).filter(lambda s: s not in TAGS), values))
    req = {"op": op, "id": draw(ints), **draw(st.dictionaries(st.text(max_size=8), values))}
    return Msg((encode(req),), "unknown-op")


def _raw(kind: str, data: bytes) -> Msg:
    return Msg((data,), kind)


# Hand-made msgpack that lies about sizes or nests absurdly: what a decoder must not
# trust (a 4 GiB str header over 3 bytes, a 2**32-element array, 64-bit ints).
HANDMADE = [
    b"\xdb\xff\xff\xff\xff abc",  # str32 claiming 4 GiB
    b"\xc6\xff\xff\xff\xff\x00",  # bin32 claiming 4 GiB
    b"\xdd\xff\xff\xff\xff\xc0",  # array32 claiming 2**32-1 items
    b"\xdf\xff\xff\xff\xff\xa2op",  # map32 claiming 2**32-1 pairs
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint64 max alone
    b"\x82\xa2op\xa4ping\xa2id\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # ping, id uint64 max
    b"\x82\xa2op\xa4ping\xa2id\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # ping, id int64 min
    b"\x82\xa2op\xa4ping\xa2id\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # ping, id NaN
    b"\x82\xa2op\xa4logs\xa5lines\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # no alias
    b"\xd4\x01\x00",  # fixext1
    b"\xc7\xff\x05" + b"\x00" * 3,  # ext8 truncated
    b"\xc1",  # never-used byte
    b"\x81\xa2op",  # map missing its value
    b"\x80",  # empty map: no op
]


def nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"\x91" * depth + b"\xc0"
    # {"op": {"op": ... }}
    return b"\x81\xa2op" * depth + b"\xa4ping"


def nested_field(base: dict[str, Any], rid: int, depth: int, kind: str) -> Msg:
    """``base`` with its id and a ``pad`` field nested ``depth`` levels (issue 43: 1,000
    of them in any field of any op raised RecursionError out of ktd's pump)."""
    fields = {**base, "id": rid}
    head = bytes([0x80 | (len(fields) + 1)])
    body = b"".join(encode(k) + encode(v) for k, v in fields.items())
    return Msg((head + body + encode("pad") + nested(depth, kind),), "nested-field")


def oversized(extra: int, valid: bool) -> Msg:
    if valid:
        pad = "x" * (p.MAX_FRAME + extra)
        return Msg((encode({"op": "ping", "id": 9, "pad": pad}),), "oversized-ping")
    return Msg((b"\xc1" * (p.MAX_FRAME + extra),), "oversized")


messages = st.one_of(
    st.binary(max_size=200).map(lambda b: _raw("random-bytes", b)),
    st.just(_raw("empty", b"")),
    values.map(lambda v: Msg((encode(v),), "random-msgpack")),
    mutated_request(),
    unknown_op(),
    st.sampled_from(HANDMADE).map(lambda b: _raw("handmade", b)),
    st.builds(nested, st.integers(1, 200_000), st.sampled_from(["array", "map"])).map(
        lambda b: _raw("nested", b)
    ),
    st.builds(
        nested_field,
        st.sampled_from(BASES),
        ints,
        st.one_of(st.integers(1, 300), st.integers(300, 100_000)),
        st.sampled_from(["array", "map"]),
    ),
    st.builds(oversized, st.integers(1, 4096), st.booleans()),
    st.lists(st.binary(max_size=40), min_size=2, max_size=5).map(
        lambda fs: Msg(tuple(fs), "multipart")
    ),
    st.sampled_from(BASES[:8]).map(lambda r: Msg((encode({**r, "id": 4242}),), "valid-safe")),
).filter(safe)


# ---------------------------------------------------------------- the clients


def _client_thread(
    ctx: zmq.Context[Any], endpoint: str, batch: list[Msg], out: list[Any], read: bool
) -> None:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0 if not read else 2000)
    try:
        s.connect(endpoint)
        for msg in batch:
            s.send_multipart(list(msg.frames))
        if not read:
            return  # hang up with replies in flight: the daemon must not care
        replies = []
        poller = zmq.Poller()
        poller.register(s, zmq.POLLIN)
        while len(replies) < len(batch) and poller.poll(15_000):
            replies.append(s.recv_multipart())
        out.append(replies)
    except Exception as exc:  # reported by the main thread
        out.append(exc)
    finally:
        s.close(0)


def _raw_garbage(path: Path, data: bytes) -> None:
    """Not even ZMTP: bytes straight onto the unix socket, then hang up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(str(path))
            s.sendall(data)
        except OSError:
            pass


def fire(d: Any, batch: list[Msg], threads: int = THREADS) -> None:
    """``threads`` DEALERs send ``batch`` (rotated, so the daemon sees interleavings) at once."""
    ctx: zmq.Context[Any] = zmq.Context()
    endpoint = f"ipc://{d.socket}"
    results: list[list[Any]] = [[] for _ in range(threads)]
    sent: list[list[Msg]] = []
    workers = []
    for i in range(threads):
        k = i % max(1, len(batch))
        mine = batch[k:] + batch[:k]
        if i >= 4:  # only a few clients send the >1 MiB frames: keep the batch quick
            mine = [m for m in mine if len(m.payload) <= p.MAX_FRAME]
        sent.append(mine)
        workers.append(
            threading.Thread(target=_client_thread, args=(ctx, endpoint, mine, results[i], True))
        )
    for j in range(2):  # hit-and-run clients that never read their replies
        workers.append(
            threading.Thread(target=_client_thread, args=(ctx, endpoint, batch[j::2], [], False))
        )
    workers.append(
        threading.Thread(target=_raw_garbage, args=(d.socket, os.urandom(64) + b"\xff" * 16))
    )
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    ctx.destroy(linger=0)
    for mine, res in zip(sent, results, strict=True):
        assert len(res) == 1, f"client thread did not finish: {res!r}"
        got = res[0]
        assert not isinstance(got, Exception), repr(got)
        assert len(got) == len(mine), (
            f"{len(mine)} messages got {len(got)} replies; daemon output:\n{d.output()}"
        )
        check_replies(mine, got)


def check_replies(mine: list[Msg], replies: list[list[bytes]]) -> None:
    """One reply per message; ``bad_request`` exactly for what ktd cannot decode."""
    want: Counter[tuple[str, int]] = Counter(m.expected() for m in mine)
    have: Counter[tuple[str, int]] = Counter()
    for frames in replies:
        reply = p.decode_reply(frames[-1])
        if isinstance(reply, p.Error):
            assert reply.code != p.ErrorCode.INTERNAL, f"internal error: {reply.message}"
            if reply.code == p.ErrorCode.BAD_REQUEST:
                have[("bad_request", reply.id)] += 1
                continue
        have[("answer", reply.id)] += 1
    assert have == want, f"replies {have - want} unexpected, {want - have} missing"


# ---------------------------------------------------------------- tests


@pytest.fixture
def fuzz_daemon(write_config: ConfigWriter, daemon_factory: Any) -> Any:
    cfg = write_config([sim_model("fz-a"), sim_model("fz-b")], daemon=FAST_DAEMON)
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        assert c.load("fz-a").state == "ready"
        d.baseline = status_view(c)
    yield d
    with d.client(timeout=60) as c:
        c.evict(all=True, force=True)
    log = d.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]


def check_unchanged(d: Any) -> None:
    with d.client(timeout=10) as c:
        assert c.ping().pid == d.proc.pid
        view = status_view(c)
    assert view == d.baseline
    assert alive(view["fz-a"][1])


def fuzz_settings(max_examples: int) -> settings:
    return budget(
        max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


@fuzz_settings(30)
@given(batch=st.lists(messages, min_size=5, max_size=40))
def test_fuzzed_batches_leave_daemon_answering_and_unchanged(
    fuzz_daemon: Any, batch: list[Msg]
) -> None:
    fire(fuzz_daemon, batch)
    check_unchanged(fuzz_daemon)


@pytest.mark.slow
@pytest.mark.timeout(900)
@fuzz_settings(1000)
@given(batch=st.lists(messages, min_size=5, max_size=80))
def test_fuzzed_batches_soak(fuzz_daemon: Any, batch: list[Msg]) -> None:
    fire(fuzz_daemon, batch, threads=32)
    check_unchanged(fuzz_daemon)


def test_every_message_kind_at_once(fuzz_daemon: Any) -> None:
    """A fixed batch with one of each hostile kind, so CI always covers all of them."""
    batch = [_raw("handmade", b) for b in HANDMADE]
    batch += [
        _raw("empty", b""),
        _raw("nested", nested(100_000, "array")),
        _raw("nested", nested(50_000, "map")),
        nested_field({"op": "status"}, 14, 1000, "array"),
        nested_field({"op": "logs", "alias": "fz-a"}, 15, 100_000, "map"),
        oversized(1, valid=True),
        oversized(100, valid=False),
        Msg((b"", b"", b""), "multipart-empty"),
        Msg((b"id", encode({"op": "ping", "id": 5})), "multipart-valid-last"),
        Msg((encode({"op": "ping", "id": 6}), b"\xc1"), "multipart-garbage-last"),
        Msg((encode({"op": "load", "alias": 3, "id": 8}),), "mutated"),
        Msg((encode({"op": "evict", "alias": "fz-a", "force": "yes", "id": 9}),), "mutated"),
        Msg((encode({"op": "shutdown", "id": "x"}),), "mutated"),
        Msg((encode({"op": "nope", "id": 7}),), "unknown-op"),
        Msg((encode({"op": ["ping"], "id": 10}),), "unknown-op"),
        # A newer minor's request: fields this daemon does not know, answered all the same.
        Msg((encode({"op": "status", "id": 11, "zz_newer": {"a": [1]}, "hint": 9}),), "newer"),
        # Cut short after its id: refused with that id (a client waits on it).
        Msg((encode({"id": 12, "op": "status", "alias": "fz-a"})[:-3],), "truncated"),
        Msg((encode({"op": "schema", "id": 13}),), "valid-safe"),
    ]
    fire(fuzz_daemon, batch)
    check_unchanged(fuzz_daemon)


def test_a_frame_nested_1000_deep_is_a_bad_request_and_ktd_and_its_engine_live_on(
    fuzz_daemon: Any,
) -> None:
    """Issue 43: ``{"op": "ping", "id": 1, "pad": [[[...]]]}``, 1,000 arrays deep (1 KB),
    killed ktd and its engines (RecursionError out of the pump). Now: ``bad_request`` with
    the id, and a config text as deep is a plan's config error (was ``internal``)."""
    ctx: zmq.Context[Any] = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(f"ipc://{fuzz_daemon.socket}")
        s.send(nested_field({"op": "ping"}, 1, 1000, "array").payload)
        deep = '[{"alias": "fz-a", "x": ' + "[" * 1000 + "]" * 1000 + "}]"
        s.send(encode({"op": "config_plan", "id": 2, "models_text": deep}))
        replies = {}
        for _ in range(2):
            assert s.poll(10_000), fuzz_daemon.output()
            reply = p.decode_reply(s.recv())
            replies[reply.id] = reply
    finally:
        s.close(0)
        ctx.destroy(linger=0)
    refused, plan = replies[1], replies[2]
    assert isinstance(refused, p.Error) and refused.code == p.ErrorCode.BAD_REQUEST
    assert "nested more than 128 levels deep" in refused.message
    assert isinstance(plan, p.ConfigPlanReply) and not plan.plan.ok
    assert "nested more than 128 levels deep" in plan.plan.problems[0].message
    check_unchanged(fuzz_daemon)  # it answers a ping, its engine runs, nothing changed


def test_a_client_that_never_reads_costs_the_others_nothing(fuzz_daemon: Any) -> None:
    """A client sends and never reads its replies, staying connected: ktd keeps a bounded
    queue for it (``REPLY_HWM``), drops the rest (and says so in its log), and answers
    everyone else meanwhile; the reader's replies arrive in order when it reads at last."""
    from ktd.daemon.main import REPLY_HWM

    ctx: zmq.Context[Any] = zmq.Context()
    mute = ctx.socket(zmq.DEALER)
    mute.setsockopt(zmq.LINGER, 0)
    mute.setsockopt(zmq.RCVHWM, 1)  # its zmq stops taking replies off the socket at once
    mute.setsockopt(zmq.SNDHWM, 0)
    mute.connect(f"ipc://{fuzz_daemon.socket}")
    sent = REPLY_HWM + 3000
    try:
        with fuzz_daemon.client(timeout=10) as other:
            for i in range(1, sent + 1):
                mute.send(encode({"op": "status", "id": i}))
                if i % 2000 == 0:  # the others are answered throughout
                    assert other.ping().pid == fuzz_daemon.proc.pid
            wait_for(lambda: "a client does not read its replies" in fuzz_daemon.output())
            assert other.ping().pid == fuzz_daemon.proc.pid
        got: list[int] = []
        while mute.poll(2000):
            got.append(p.decode_reply(mute.recv()).id)
        # What it reads: the oldest replies first, in order (then whatever ktd answered
        # once it read again), and fewer than it asked for: the rest were dropped.
        assert got[:REPLY_HWM] == list(range(1, REPLY_HWM + 1))
        assert got == sorted(got) and len(got) < sent, len(got)
    finally:
        mute.close(0)
        ctx.destroy(linger=0)
    check_unchanged(fuzz_daemon)


def test_frame_over_the_hard_limit_drops_only_that_client(fuzz_daemon: Any) -> None:
    """A >16 MiB frame: zmq drops that connection before Python sees it; others are served."""
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"ipc://{fuzz_daemon.socket}")
        s.send(b"\x00" * (p.HARD_MAX_FRAME + 1))
        s.send(encode({"op": "ping", "id": 1}))  # may or may not survive the reconnect
        s.poll(1000)
        s.close(0)
    finally:
        ctx.destroy(linger=0)
    check_unchanged(fuzz_daemon)
