"""ktctl.Client against in-test zmq peers: reachability, id matching, errors, events.

No real daemon here (the lead's end-to-end tests cover that): a tiny ROUTER+PUB
thread answers canned replies, which is enough to pin down the client's own
contract and keeps the whole file well under a few seconds.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from ktctl import Client, ConnectionLost, DaemonUnreachable, KtdError, ProtocolError
from ktctl.client import probe, resolve_socket
from ktd import protocol as p
from tests.ktctl.ktctl_fakes import Answer, FakeDaemon, Handler


def engine(alias: str = "m", state: str = "ready", **kw: Any) -> p.EngineInfo:
    return p.EngineInfo(alias=alias, state=state, **kw)


def basic(req: p.Request, d: FakeDaemon) -> Answer:
    if isinstance(req, p.Ping):
        return [p.Pong(id=req.id, version="9.9", pid=42)]
    if isinstance(req, p.Status):
        if req.alias not in (None, "m"):
            return [p.Error(id=req.id, code="unknown_model", message=f"no model {req.alias}")]
        return [p.StatusReply(id=req.id, engines=[engine(pid=7, port=30000)])]
    return [p.Error(id=req.id, code="bad_request", message="unsupported", detail={"op": "x"})]


# ---------------------------------------------------------------- reachability


def test_resolve_socket_prefers_argument_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTD_SOCKET", "ipc:///tmp/env.sock")
    assert resolve_socket() == Path("/tmp/env.sock")
    assert resolve_socket("ipc:///tmp/arg.sock") == Path("/tmp/arg.sock")
    assert resolve_socket(Path("/tmp/p.sock")) == Path("/tmp/p.sock")
    monkeypatch.delenv("KTD_SOCKET")
    monkeypatch.setenv("KTD_RUNTIME_DIR", "/tmp/rt")
    assert Client().socket_path == Path("/tmp/rt/control.sock")
    assert Client().events_path == Path("/tmp/rt/events.sock")


def test_missing_socket_is_unreachable_at_once(rundir: Path) -> None:
    path = rundir / "control.sock"
    t0 = time.monotonic()
    with Client(path) as c, pytest.raises(DaemonUnreachable) as info:
        c.ping()
    assert time.monotonic() - t0 < 0.5
    msg = str(info.value)
    assert f"no control socket at {path}" in msg
    assert "ktd serve" in msg and "\n" not in msg


def test_stale_socket_file_is_unreachable(rundir: Path) -> None:
    path = rundir / "control.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays: what a SIGKILLed daemon leaves behind
    assert path.exists()
    with pytest.raises(DaemonUnreachable, match="stale socket"):
        probe(path)
    with Client(path) as c, pytest.raises(DaemonUnreachable, match="stale"):
        c.status()


def test_regular_file_is_not_a_socket(rundir: Path) -> None:
    path = rundir / "control.sock"
    path.write_text("")
    with pytest.raises(DaemonUnreachable, match="not a socket"):
        probe(path)


def test_silent_daemon_times_out(rundir: Path) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"ipc://{rundir / 'control.sock'}")
    try:
        t0 = time.monotonic()
        with (
            Client(rundir / "control.sock", timeout=0.3) as c,
            pytest.raises(DaemonUnreachable, match="no reply"),
        ):
            c.ping()
        assert 0.25 < time.monotonic() - t0 < 1.5
    finally:
        ctx.destroy(linger=0)


# ---------------------------------------------------------------- replies


def test_ping_and_status(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = fake_daemon(basic)
    with Client(d.path) as c:
        pong = c.ping()
        assert (pong.version, pong.pid) == ("9.9", 42)
        engines = c.status()
        assert [e.alias for e in engines] == ["m"] and engines[0].port == 30000
        c.status("m")
    ids = [r.id for r in d.requests]
    assert ids == sorted(set(ids)) and ids[0] >= 1


def test_error_reply_raises_ktd_error(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = fake_daemon(basic)
    with Client(d.path) as c:
        with pytest.raises(KtdError) as info:
            c.status("nope")
        assert info.value.code == "unknown_model"
        assert info.value.message == "no model nope"
        with pytest.raises(KtdError) as info:
            c.models()
        assert info.value.code == "bad_request" and info.value.detail == {"op": "x"}
        assert c.ping().pid == 42  # the connection is still usable after errors


def test_replies_with_other_ids_are_ignored(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        return [
            p.Pong(id=req.id + 1000, version="wrong", pid=1),
            b"\x93not msgpack of a reply",
            p.Pong(id=req.id, version="right", pid=2),
        ]

    d = fake_daemon(handler)
    with Client(d.path) as c:
        assert c.ping().version == "right"


def test_late_reply_of_timed_out_request_is_dropped(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    held: list[int] = []

    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        if not held:
            held.append(req.id)
            return None  # answer this one late
        late = p.Pong(id=held[0], version="late", pid=1)
        return [late, p.Pong(id=req.id, version="fresh", pid=2)]

    d = fake_daemon(handler)
    with Client(d.path, timeout=0.3) as c:
        with pytest.raises(DaemonUnreachable):
            c.ping()
        assert c.ping().version == "fresh"


def test_undecodable_reply_for_our_id_is_a_protocol_error(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        return [msgspec.msgpack.encode({"type": "from_the_future", "id": req.id})]

    d = fake_daemon(handler)
    with Client(d.path) as c, pytest.raises(ProtocolError, match="same version"):
        c.ping()


def test_unexpected_reply_type_is_a_protocol_error(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    d = fake_daemon(lambda req, d: [p.Ok(id=req.id)])
    with Client(d.path) as c, pytest.raises(ProtocolError, match="StatusReply"):
        c.status()


def test_any_request_s_reply_is_checked_by_the_protocol_s_table(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    """``request`` (what ``ktctl catalog`` and ``pull`` send through) pairs the reply by
    ``p.REPLIES`` as the typed calls do: a ``pulls`` answer to ``catalog`` is refused."""
    d = fake_daemon(lambda req, d: [p.PullsReply(id=req.id)])
    with Client(d.path) as c:
        with pytest.raises(ProtocolError, match="PullsReply to Catalog, where CatalogReply"):
            c.request(p.Catalog(name="m"))
        assert isinstance(c.request(p.PullCancel(name="m")), p.PullsReply)


def test_request_does_not_touch_the_callers_message(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    d = fake_daemon(basic)
    msg = p.Ping()
    with Client(d.path) as c:
        reply = c.request(msg)
        reply2 = c.request(msg, timeout=math.inf)
    assert isinstance(reply, p.Pong) and isinstance(reply2, p.Pong)
    assert msg.id == 0 and reply.id != reply2.id


def test_evict_needs_alias_or_all() -> None:
    c = Client("/nonexistent/control.sock")
    with pytest.raises(ValueError):
        c.evict()
    with pytest.raises(ValueError):
        c.evict("m", all=True)


def test_wire_arguments_of_operations(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        match req:
            case p.Load(dry_run=True):
                return [p.PlanReply(id=req.id, plan={"argv": ["python"]})]
            case p.Load():
                return [p.LoadReply(id=req.id, engine=engine(req.alias))]
            case p.Evict():
                return [
                    p.EvictReply(id=req.id, evicted=["a", "b"] if req.all else [str(req.alias)])
                ]
            case p.Logs():
                return [p.LogsReply(id=req.id, alias=req.alias, lines=["x"] * req.lines)]
            case p.Acquire():
                return [p.AcquireReply(id=req.id, lease="L1", alias=req.model, url="http://h:1")]
            case p.Doctor():
                return [p.DoctorReply(id=req.id, report={"checks": []})]
            case p.Models():
                return [p.ModelsReply(id=req.id, models=[])]
        return [p.Ok(id=req.id, message="fine")]

    d = fake_daemon(handler)
    with Client(d.path) as c:
        assert c.load("m").state == "ready"
        assert c.load("m", wait=False, timeout=3).alias == "m"
        assert c.load("m", dry_run=True) == {"argv": ["python"]}
        assert c.evict("m", force=True, timeout=2) == ["m"]
        assert c.evict(all=True) == ["a", "b"]
        assert c.logs("m", 3) == ["x", "x", "x"]
        assert c.acquire("m", "fe-1").lease == "L1"
        c.release("L1")
        c.heartbeat("fe-1")
        assert c.doctor() == {"checks": []}
        assert c.models() == []
        assert isinstance(c.reload(), p.Ok)
        assert c.shutdown() == "fine"
    by_type = {type(r).__name__: r for r in d.requests}
    loads = [r for r in d.requests if isinstance(r, p.Load)]
    assert [(r.wait, r.timeout, r.dry_run) for r in loads] == [
        (True, None, False),
        (False, 3, False),
        (True, None, True),
    ]
    evict = by_type["Evict"]
    assert isinstance(evict, p.Evict) and evict.all
    assert isinstance(by_type["Release"], p.Release) and by_type["Release"].lease == "L1"


# ---------------------------------------------------------------- long waits and events


def test_daemon_death_ends_an_unbounded_wait(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = fake_daemon(lambda req, d: "die")
    t0 = time.monotonic()
    with (
        Client(d.path, timeout=0.5) as c,
        pytest.raises(ConnectionLost, match="lost the connection"),
    ):
        c.load("m")  # wait=True, timeout=None: no overall limit
    assert time.monotonic() - t0 < 3


def test_shutdown_counts_a_vanished_daemon_as_done(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    d = fake_daemon(lambda req, d: "die")
    with Client(d.path) as c:
        assert c.shutdown() == "ktd exited"


def test_load_progress_sees_events_published_right_after_the_request(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        if isinstance(req, p.Load):
            now = time.time()
            d.publish(p.Event(topic="engine.m-big", time=now, alias="m-big", state="starting"))
            d.publish(p.Event(topic="engine.m", time=now, alias="m", state="starting"))
            d.publish(p.Event(topic="log.m", time=now, alias="m", lines=["loading", "50%"]))
            d.publish(p.Event(topic="engine.m", time=now, alias="m", state="ready"))
            return [p.LoadReply(id=req.id, engine=engine(pid=9))]
        return None

    d = fake_daemon(handler)
    seen: list[p.Event] = []
    ticks = itertools.count()

    def progress(ev: p.Event | None) -> None:
        if ev is None:
            next(ticks)
        else:
            seen.append(ev)

    with Client(d.path) as c:
        info = c.load("m", progress=progress)
    assert info.pid == 9
    # exact topics: engine.m-big is not engine.m
    assert [(e.topic, e.state, e.lines) for e in seen] == [
        ("engine.m", "starting", []),
        ("log.m", None, ["loading", "50%"]),
        ("engine.m", "ready", []),
    ]


@pytest.mark.parametrize("reply_first", [False, True])
def test_follow_logs_drops_by_count_what_the_tail_holds(
    fake_daemon: Callable[[Handler], FakeDaemon], reply_first: bool
) -> None:
    """Lines written while the tail is read arrive both ways, and their events may come
    before or after the tail's reply (another socket: the flaky seam of ``logs -f``,
    lines shown twice). They are dropped by the log's line count, never by text: the
    engine's repeated lines (here "x" three times) are all shown."""
    seen = [
        p.Event(topic="log.m", time=0, alias="m", lines=["a", "x"], upto=2),
        p.Event(topic="log.m", time=0, alias="m", lines=["x"], upto=3),
    ]
    new = [p.Event(topic="log.m", time=0, alias="m", lines=["x", "c"], upto=5)]

    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        if isinstance(req, p.Logs):
            if not reply_first:
                for ev in [*seen, *new]:
                    d.publish(ev)
            d.publish(p.Event(topic="log.mm", time=0, alias="mm", lines=["other"], upto=9))
            return [p.LogsReply(id=req.id, alias="m", lines=["a", "x", "x"], upto=3)]
        return None

    d = fake_daemon(handler)
    with Client(d.path) as c:
        it = c.follow_logs("m", 3)
        assert [next(it), next(it), next(it)] == ["a", "x", "x"]
        if reply_first:
            for ev in [*seen, *new]:
                d.outbox.put(ev)
        assert [next(it), next(it)] == ["x", "c"]
        d.outbox.put(p.Event(topic="log.m", time=0, alias="m", lines=["d"], upto=6))
        assert next(it) == "d"
        it.close()
    logs = [r for r in d.requests if isinstance(r, p.Logs)]
    assert logs[0].lines == 3


def test_follow_logs_of_a_daemon_that_does_not_count_keeps_following(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        if isinstance(req, p.Logs):
            return [p.LogsReply(id=req.id, alias="m", lines=["a", "b"])]
        return None

    d = fake_daemon(handler)
    with Client(d.path) as c:
        it = c.follow_logs("m", 2)
        assert [next(it), next(it)] == ["a", "b"]
        d.outbox.put(p.Event(topic="log.m", time=0, alias="m", lines=["c"]))
        assert next(it) == "c"
        it.close()


def test_events_stream_all_topics(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = fake_daemon(basic)
    with Client(d.path) as c:
        it = c.events()
        d.outbox.put(p.Event(topic="engine.m", time=1.0, alias="m", state="ready"))
        d.outbox.put(p.Event(topic="lease.m", time=2.0, alias="m", in_flight=1))
        got = [next(it), next(it)]
        assert [e.topic for e in got] == ["engine.m", "lease.m"]
        sub = c.subscribe(["log."])
        assert sub.get(0.05) is None
        d.outbox.put(p.Event(topic="engine.m", time=3.0, alias="m", state="stopped"))
        d.outbox.put(p.Event(topic="log.m", time=3.0, alias="m", lines=["x"]))
        ev = sub.get(2)
        assert ev is not None and ev.topic == "log.m"
    # close() with a live generator and subscription must not hang


def test_events_without_events_socket_is_unreachable(rundir: Path) -> None:
    with Client(rundir / "control.sock") as c, pytest.raises(DaemonUnreachable, match="events"):
        c.events()


def test_close_is_idempotent_and_cheap_when_unused(rundir: Path) -> None:
    c = Client(rundir / "control.sock")
    c.close()
    c.close()
    assert "control.sock" in repr(c)


def test_no_thread_or_fd_leak_after_close(fake_daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = fake_daemon(basic)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with Client(d.path) as c:
            c.ping()
    assert len(os.listdir("/proc/self/fd")) <= fds + 2


def test_wedged_listener_bounds_even_an_unbounded_load(rundir: Path) -> None:
    """The kernel accepts the connection but nobody speaks zmq: no infinite hang."""
    path = rundir / "control.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    try:
        t0 = time.monotonic()
        with Client(path, timeout=0.3) as c, pytest.raises(DaemonUnreachable, match="hung"):
            c.load("m")  # wait=True, timeout=None
        assert time.monotonic() - t0 < 2
    finally:
        listener.close()


def test_daemon_gone_between_requests_is_reported_precisely(
    fake_daemon: Callable[[Handler], FakeDaemon],
) -> None:
    d = fake_daemon(basic)
    with Client(d.path, timeout=0.3) as c:
        assert c.ping().pid == 42
        d.close()  # zmq unlinks the ipc file it bound
        with pytest.raises(DaemonUnreachable, match="ktd is not running"):
            c.ping()
