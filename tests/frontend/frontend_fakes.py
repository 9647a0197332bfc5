"""In-process stand-ins for the daemon and an engine, for white-box frontend tests.

The fake engine is raw trio + h11 on purpose: it notices a client hang-up by
reading EOF from its own socket, independently of Hypercorn, so a test can
tell whether the frontend really closed its upstream connection.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import msgspec
import trio
import zmq

from ktd import paths
from ktd import protocol as p
from ktd.control.zmqtrio import Frames, TrioSocket

# ---------------------------------------------------------------- fake daemon


@dataclass
class FakeModel:
    alias: str
    url: str = ""
    state: str = "stopped"
    served: bool = True
    backend: str = "kt"
    load_delay: float = 0.0
    hold: trio.Event | None = None  # the load also waits for this (a test's own moment)
    error: tuple[str, str, dict[str, Any]] | None = None  # (code, message, detail)
    loads: int = 0
    loaded: trio.Event = field(default_factory=trio.Event)
    loading: bool = False
    max_concurrent: int | None = None
    max_queue: int | None = None


class FakeDaemon:
    """A ROUTER socket answering ping/models/claim/sync/return like ktd.

    ``in_flight`` is what the frontend's last report says runs on its claims;
    ``recall()`` sends a recall through the long poll, as ktd does before a drain.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.models: dict[str, FakeModel] = {}
        self.claims: dict[str, str] = {}  # claim id -> alias
        self.acquires = 0  # Claim requests
        # Claims given back, in order. A claim may come back twice: a recall that
        # crossed its Return is answered with another (the frontend no longer holds it).
        self.returned: list[str] = []
        self.heartbeats = 0  # reports (Sync)
        self.reported: dict[str, int] = {}  # claim -> in flight, from the last report
        self.recalls: list[p.Recall] = []
        self._untold = 0  # recalls not yet sent: a long poll is answered at once
        self.mute = False  # True: read and drop everything, as a stopped ktd would
        # The usage ledger's part (off: an older ktd that acknowledges nothing).
        self.keep_usage = False
        self.usage: list[p.UsageCount] = []  # every batch added, once
        self.usage_seq = 0
        self.spent: dict[str, int] = {}  # the reply's day of tokens per key
        self._wake = trio.Event()
        self.requests: list[p.Request] = []
        self._ids = itertools.count(1)
        self._sock: TrioSocket | None = None
        self._nursery: trio.Nursery | None = None

    def add(self, alias: str, **kw: Any) -> FakeModel:
        m = FakeModel(alias, **kw)
        if m.state == "ready":
            m.loaded.set()
        self.models[alias] = m
        return m

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.bind(self.endpoint)
        self._sock = TrioSocket(raw, self._on_message)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sock.run)
                task_status.started()
        finally:
            self._sock.close()

    @property
    def returns(self) -> int:
        return len(self.returned)

    @property
    def in_flight(self) -> int:
        return sum(self.reported.values())

    def recall(self, alias: str, kind: str = "drain", idle: float = 0.0) -> None:
        for claim, a in self.claims.items():
            if a == alias:
                self.recalls.append(p.Recall(claim=claim, alias=a, kind=kind, idle=idle))
                self._untold += 1
        self._wake.set()
        self._wake = trio.Event()

    def _sync_reply(self, rid: int) -> p.SyncReply:
        live = [r for r in self.recalls if r.claim in self.claims]
        self.recalls = live
        self._untold = 0
        limits = {
            m.alias: p.Limits(max_concurrent=m.max_concurrent, max_queue=m.max_queue)
            for m in self.models.values()
            if m.max_concurrent is not None or m.max_queue is not None
        }
        reply = p.SyncReply(id=rid, daemon="fake", recalls=list(live), limits=limits)
        if self.keep_usage:
            reply.usage_seq, reply.day, reply.spent = self.usage_seq, "2026-12-04", self.spent
        return reply

    async def _park(self, ident: bytes, req: p.Sync) -> None:
        with trio.move_on_after(req.wait):
            await self._wake.wait()
        if not self.mute:
            self._reply(ident, self._sync_reply(req.id))

    def _reply(self, ident: bytes, reply: p.Reply) -> None:
        assert self._sock is not None
        self._sock.send([ident, p.encode(reply)])

    def _on_message(self, frames: Frames) -> None:
        if self.mute:
            return
        ident, payload = frames[0], frames[-1]
        req = p.decode_request(payload)
        self.requests.append(req)
        rid = req.id
        if isinstance(req, p.Ping):
            self._reply(ident, p.Pong(id=rid, version="fake", pid=0))
        elif isinstance(req, p.Sync):
            self.heartbeats += 1
            self.reported = {c.claim: c.in_flight for c in req.claims}
            if self.keep_usage and req.usage_seq > self.usage_seq:
                self.usage += req.usage
                self.usage_seq = req.usage_seq
            if req.wait > 0 and not self._untold:
                assert self._nursery is not None
                self._nursery.start_soon(self._park, ident, req)
            else:
                self._reply(ident, self._sync_reply(rid))
        elif isinstance(req, p.Models):
            infos = [
                p.ModelInfo(
                    alias=m.alias, backend=m.backend, served=m.served, path="/m", state=m.state
                )
                for m in self.models.values()
            ]
            self._reply(ident, p.ModelsReply(id=rid, models=infos))
        elif isinstance(req, p.Return):
            self.returned.append(req.claim)
            self.claims.pop(req.claim, None)
            self.reported.pop(req.claim, None)
            self._reply(ident, p.Ok(id=rid))
        elif isinstance(req, p.Claim):
            self.acquires += 1
            assert self._nursery is not None
            self._nursery.start_soon(self._claim, ident, req)
        else:
            self._reply(ident, p.Error(id=rid, code="bad_request", message="not faked"))

    async def _claim(self, ident: bytes, req: p.Claim) -> None:
        m = self.models.get(req.model)
        if m is None:
            names = [x.alias for x in self.models.values() if x.served]
            self._reply(
                ident,
                p.Error(
                    id=req.id,
                    code="unknown_model",
                    message=f"unknown model {req.model!r}",
                    detail={"models": names},
                ),
            )
            return
        if not m.loaded.is_set():
            if not req.autoload:
                self._reply(ident, p.Error(id=req.id, code="not_loaded", message="not loaded"))
                return
            if not m.loading:
                m.loading = True
                m.loads += 1
                m.state = "starting"
                await trio.sleep(m.load_delay)
                if m.hold is not None:
                    await m.hold.wait()
                m.loading = False
                if m.error is None:
                    m.state = "ready"
                m.loaded.set()
            else:
                await m.loaded.wait()
        if m.error is not None:
            code, message, detail = m.error
            self._reply(ident, p.Error(id=req.id, code=code, message=message, detail=detail))
            return
        n = next(self._ids)
        claim = f"claim-{n}"
        self.claims[claim] = m.alias
        self._reply(
            ident,
            p.ClaimReply(
                id=req.id,
                claim=claim,
                alias=m.alias,
                url=m.url,
                daemon="fake",
                grant=n,
                max_concurrent=m.max_concurrent,
                max_queue=m.max_queue,
            ),
        )


class StatusDaemon(FakeDaemon):
    """A FakeDaemon that also answers what the dashboard and ``/api/ps`` ask: status (its
    ``engines``), models (from them), machine, dry-runs (``estimate``), logs, usage, and the
    sleep/wake/evict buttons, which move an engine at once (``refuse``: alias -> the
    ``Error`` code and message a sleep or a wake of it gets instead)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.engines: dict[str, p.EngineInfo] = {}
        self.machine = p.MachineReply()
        self.estimate: dict[str, Any] = {}
        self.refuse: dict[str, tuple[str, str]] = {}
        self._events: TrioSocket | None = None

    def put(self, engine: p.EngineInfo) -> None:
        """Set an engine as it is now, and say so on the events socket as ktd does (a
        page sees the change at once, not at the dashboard's next status refresh)."""
        self.engines[engine.alias] = engine
        if self._events is not None:
            event = p.Event(
                topic="engine", time=time.time(), alias=engine.alias, state=engine.state
            )
            self._events.send([f"engine.{engine.alias}".encode(), msgspec.msgpack.encode(event)])

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The control socket, and the events socket beside it where ktd has it (an XPUB
        that greets each subscription with ``WELCOME``)."""
        raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.XPUB)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.XPUB_WELCOME_MSG, p.WELCOME)
        control = Path(self.endpoint.removeprefix("ipc://"))
        raw.bind(paths.endpoint(paths.events_path(control)))
        self._events = TrioSocket(raw, lambda frames: None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._events.run)
                await nursery.start(super().run)
                task_status.started()
        finally:
            self._events.close()
            self._events = None

    def _on_message(self, frames: Frames) -> None:
        if self.mute:
            return
        req = p.decode_request(frames[-1])
        reply = self._answer(req)
        if reply is None:
            super()._on_message(frames)
            return
        self.requests.append(req)
        reply.id = req.id
        self._reply(frames[0], reply)

    def _answer(self, req: p.Request) -> p.Reply | None:
        match req:
            case p.Status(alias=alias):
                found = [e for e in self.engines.values() if alias is None or e.alias == alias]
                return p.StatusReply(engines=found)
            case p.Models():
                infos = [
                    p.ModelInfo(
                        alias=e.alias,
                        backend="kt",
                        served=True,
                        path=f"/m/{e.alias}",
                        state=e.state,
                    )
                    for e in self.engines.values()
                ]
                return p.ModelsReply(models=infos)
            case p.Machine():
                return self.machine
            case p.Load(dry_run=True):
                return p.PlanReply(plan={"ok": True, "estimate": self.estimate})
            case p.Logs(alias=alias):
                return p.LogsReply(alias=alias, lines=[f"[ktd] {alias}"])
            case p.Usage():
                return p.UsageReply(rows=self.usage)
            case p.Sleep(alias=alias) | p.Wake(alias=alias) if alias in self.refuse:
                code, message = self.refuse[alias]
                return p.Error(code=code, message=message)
            case p.Sleep(alias=alias):
                return p.LoadReply(engine=self._move(alias, "asleep"))
            case p.Wake(alias=alias):
                return p.LoadReply(engine=self._move(alias, "ready"))
            case p.Evict(alias=alias) if alias is not None:
                self._move(alias, "stopped")
                return p.EvictReply(evicted=[alias])
        return None

    def _move(self, alias: str, state: str) -> p.EngineInfo:
        e = msgspec.structs.replace(self.engines[alias], state=state)
        if state == "asleep":
            e = msgspec.structs.replace(e, asleep_since=time.time(), host_bytes=8 << 30)
        else:
            e = msgspec.structs.replace(e, asleep_since=None, host_bytes=None)
        self.put(e)
        return e


# ---------------------------------------------------------------- fake engine


@dataclass
class Seen:
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: bytes


class FakeEngine:
    """An SGLang-ish HTTP/1.1 server on raw trio sockets.

    ``chunks`` SSE events per stream, ``chunk_delay`` apart; ``die_after`` cuts
    the TCP connection after that many chunks (engine death); ``status`` != 200
    answers an SGLang-shaped error instead.
    """

    def __init__(self) -> None:
        self.port = 0
        self.chunks = 5
        self.chunk_delay = 0.0
        self.die_after: int | None = None
        self.status = 200
        self.seen: list[Seen] = []
        self.active = 0
        self.aborted = 0
        self.completed = 0
        self.aborted_event = trio.Event()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                req = await self._read_request(conn, stream)
                if req is None:
                    return
                keep = await self._respond(conn, stream, req)
                if not keep or conn.our_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> Seen | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                seen = Seen(
                    head.method.decode(), head.target.decode(), list(head.headers), bytes(body)
                )
                self.seen.append(seen)
                return seen
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _send(self, conn: h11.Connection, stream: trio.SocketStream, event: Any) -> None:
        data = conn.send(event)
        if data:
            await stream.send_all(data)

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream, req: Seen) -> bool:
        try:
            obj = json.loads(req.body)
        except ValueError:
            obj = {}
        if self.status != 200:
            body = json.dumps(
                {
                    "object": "error",
                    "message": "fake engine says no",
                    "type": "BadRequestError",
                    "param": None,
                    "code": self.status,
                }
            ).encode()
            await self._send(
                conn,
                stream,
                h11.Response(
                    status_code=self.status,
                    headers=[
                        ("content-type", "application/json"),
                        ("content-length", str(len(body))),
                    ],
                ),
            )
            await self._send(conn, stream, h11.Data(data=body))
            await self._send(conn, stream, h11.EndOfMessage())
            return True
        if not obj.get("stream"):
            body = json.dumps(
                {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "model": obj.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hello"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            ).encode()
            await self._send(
                conn,
                stream,
                h11.Response(
                    status_code=200,
                    headers=[
                        ("content-type", "application/json"),
                        ("content-length", str(len(body))),
                    ],
                ),
            )
            await self._send(conn, stream, h11.Data(data=body))
            await self._send(conn, stream, h11.EndOfMessage())
            self.completed += 1
            return True
        return await self._stream(conn, stream, obj)

    def events(self, model: str) -> list[bytes]:
        out = []
        for i in range(self.chunks):
            chunk = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
            }
            out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        return out

    async def _stream(self, conn: h11.Connection, stream: trio.SocketStream, obj: Any) -> bool:
        await self._send(
            conn,
            stream,
            h11.Response(status_code=200, headers=[("content-type", "text/event-stream")]),
        )
        self.active += 1
        hung_up = False
        try:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    nonlocal hung_up
                    # The client sends nothing more on this request: EOF = hang-up.
                    try:
                        data = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        hung_up = True
                        nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                try:
                    await self._stream_events(conn, stream, obj, nursery)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    hung_up = True
                    nursery.cancel_scope.cancel()
        finally:
            self.active -= 1
        if hung_up:
            self.aborted += 1
            self.aborted_event.set()
            return False
        self.completed += 1
        return False  # one stream per connection keeps the watcher simple

    async def _stream_events(
        self, conn: h11.Connection, stream: trio.SocketStream, obj: Any, nursery: trio.Nursery
    ) -> None:
        for i, event in enumerate(self.events(str(obj.get("model")))):
            if self.die_after is not None and i == self.die_after:
                await stream.send_all(b"5\r\ndata:\r\n")  # half an event, then gone
                await stream.aclose()
                nursery.cancel_scope.cancel()
                return
            await self._send(conn, stream, h11.Data(data=event))
            if self.chunk_delay:
                await trio.sleep(self.chunk_delay)
        if (obj.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "c1", "choices": [], "usage": {"total_tokens": self.chunks}}
            await self._send(
                conn, stream, h11.Data(data=b"data: " + json.dumps(usage).encode() + b"\n\n")
            )
        await self._send(conn, stream, h11.Data(data=b"data: [DONE]\n\n"))
        await self._send(conn, stream, h11.EndOfMessage())
        nursery.cancel_scope.cancel()
