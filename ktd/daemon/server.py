"""The control server: a ROUTER socket answering protocol requests, and the PUB socket.

Each request is handled in its own task (a ``load`` may wait minutes); the
socket itself is pumped by one task (``TrioSocket``). A frame that cannot be
decoded gets a ``bad_request`` reply; nothing a client sends can raise out of here.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio
import zmq

from ktd import __version__, foreign, protocol_schema
from ktd import protocol as p
from ktd.catalog.pulls import Puller
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import Frames, Peer, TrioSocket
from ktd.core import trust
from ktd.daemon.configdesk import ConfigDesk, Who
from ktd.daemon.controls import Controls
from ktd.daemon.pool import Pool
from ktd.frameid import peek_id, skim_id

log = logging.getLogger("ktd.server")

#: The uid of a sender the socket did not show: no one's (never ktd's owner, nor root).
NOBODY = -1

_OPS = frozenset(str(t.__struct_config__.tag) for t in p.AnyRequest.__args__)


def _op_of(payload: bytes) -> str | None:
    """The ``op`` of a frame that decodes as msgpack but not as a request, if it is a string."""
    try:
        obj = foreign.msgpack_any(payload)
    except msgspec.DecodeError:
        return None
    op = obj.get("op") if isinstance(obj, dict) else None
    return op if isinstance(op, str) else None


def _asker(uid: int | None) -> int:
    """A request whose sender the socket did not show (no Peer-Address: not ipc, not
    Linux) is nobody's: it may read the config, not change it (fail closed)."""
    return uid if uid is not None else NOBODY


def error_reply(req: p.Request, exc: Exception) -> p.Error:
    """ControlErrors carry their stable code; anything else is a bug, logged, never fatal."""
    if isinstance(exc, ControlError):
        return exc.to_reply()
    log.error("request %r failed", req, exc_info=exc)
    return p.Error(code=p.ErrorCode.INTERNAL, message=f"internal error: {exc!r}")


class ControlServer:
    """The control socket's requests, each routed to who answers it: the engines' control
    operations (``ops``), the pool's leases and claims, the config desk, the catalog's
    pulls and the daemon's own (reload, doctor, shutdown)."""

    def __init__(
        self,
        ops: Controls,
        control: zmq.Socket[bytes],
        events: zmq.Socket[bytes],
        *,
        reload: Callable[[Who], Awaitable[str]],
        doctor: Callable[[], Awaitable[dict[str, Any]]],
        dry_run: Callable[[str], Awaitable[dict[str, Any]]],
        shutdown: Callable[[], None],
        gateway: Callable[[], p.GatewayInfo | None] = lambda: None,
        machine: Callable[[], Awaitable[p.MachineReply]] | None = None,
        config: ConfigDesk | None = None,
        catalog: Callable[[str | None], Awaitable[p.CatalogReply]] | None = None,
        pulls: Puller | None = None,
    ) -> None:
        self.ops = ops
        # peers: who sent each request (the config history records it)
        self.control = TrioSocket(
            control,
            self._on_message,
            on_drop=self._undelivered,
            on_full=self._unread,
            peers=True,
        )
        self._unread_since_warning = 0
        self._warned_at = -math.inf
        # An XPUB: subscriptions come in as messages, read and dropped (zmq keeps them).
        self.events = TrioSocket(events, lambda frames: None, max_outbox=10_000)
        self._reload = reload
        self._doctor = doctor
        self._dry_run = dry_run
        self._shutdown = shutdown
        self._gateway = gateway
        self._machine = machine
        self._config = config
        self._catalog = catalog
        self._pulls = pulls
        self._nursery: trio.Nursery | None = None
        self._encoder = msgspec.msgpack.Encoder()

    @property
    def pool(self) -> Pool:
        """The engines' pool, whose leases and claims the frontends' requests take."""
        return self.ops.pool

    def publish(self, topic: str, event: p.Event) -> None:
        self.events.send([topic.encode(), self._encoder.encode(event)])

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.control.run)
            nursery.start_soon(self.events.run)
            task_status.started()

    def close(self) -> None:
        self.control.close()
        self.events.close()

    # ------------------------------------------------------------ dispatch

    def _undelivered(self, frames: Frames) -> None:
        """A reply that cannot reach its client: a lease it granted goes back at once."""
        try:
            reply = p.decode_reply(frames[-1])
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
            return
        if isinstance(reply, p.AcquireReply):
            self.pool.release(reply.lease)
            log.info("undeliverable reply: lease %s released", reply.lease)
        else:
            log.debug("undeliverable reply dropped: %s", type(reply).__name__)

    def _unread(self, frames: Frames) -> None:
        """A reply to a client with ``REPLY_HWM`` replies unread (one that sends and never
        reads): dropped like an undeliverable one, and said in the log at most every
        10 s, with how many."""
        self._undelivered(frames)
        self._unread_since_warning += 1
        now = trio.current_time()
        if now - self._warned_at >= 10.0:
            log.warning(
                "dropped %d control replies: a client does not read its replies",
                self._unread_since_warning,
            )
            self._warned_at, self._unread_since_warning = now, 0

    def _reply(self, envelope: Frames, reply: p.Reply) -> None:
        self.control.send([*envelope, self._encoder.encode(reply)])

    def _bad_request(
        self, envelope: Frames, rid: int, message: str, detail: dict[str, Any] | None = None
    ) -> None:
        """Answer a frame that is no request (too big, undecodable), by the id it carries."""
        error = p.Error(id=rid, code=p.ErrorCode.BAD_REQUEST, message=message, detail=detail or {})
        self._reply(envelope, error)

    def _on_message(self, frames: Frames) -> None:
        if len(frames) < 2:
            return  # no identity: nobody to answer
        envelope, payload = frames[:-1], frames[-1]
        if len(payload) > p.MAX_FRAME:
            msg = f"frame of {len(payload)} bytes exceeds {p.MAX_FRAME}"
            self._bad_request(envelope, skim_id(payload), msg)
            return
        try:
            req = p.decode_request(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(envelope, payload, exc)
            return
        try:
            reply = self._answer_now(req)
        except Exception as exc:  # the daemon never dies of a request
            reply = error_reply(req, exc)
        if reply is not None:
            reply.id = req.id
            self._reply(envelope, reply)
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._handle, envelope, req, self.control.sender)

    def _malformed(self, envelope: Frames, payload: bytes, exc: Exception) -> None:
        """``bad_request`` for a frame that did not decode, with the request's id when it
        can be read (a truncated frame's too, from its first bytes), and for an op this
        daemon does not know, ``detail.unknown_op`` and the protocol it speaks: a newer
        client's new request (docs/protocol.md, "Compatibility")."""
        rid = peek_id(payload) or skim_id(payload)
        op = _op_of(payload)
        if op is not None and op not in _OPS:
            message = f"unknown op {op[:64]!r}: this ktd speaks protocol {p.PROTOCOL}"
            detail = {"unknown_op": op[:64], "protocol": str(p.PROTOCOL)}
            self._bad_request(envelope, rid, message, detail)
            return
        self._bad_request(envelope, rid, f"malformed request: {exc}")

    async def _handle(self, envelope: Frames, req: p.Request, peer: Peer | None) -> None:
        try:
            reply = await self._dispatch(req, peer)
        except Exception as exc:  # the daemon never dies of a request
            reply = error_reply(req, exc)
        reply.id = req.id
        self._reply(envelope, reply)

    def _sender_pid(self) -> int | None:
        """The pid of the message's sender, as the kernel gave it (``SO_PEERCRED``)."""
        peer = self.control.sender
        return peer.pid if peer is not None else None

    def _by_owner(self) -> bool:
        """Whether the request being read was sent by ktd's owner (``SO_PEERCRED``)."""
        peer = self.control.sender
        return peer is not None and trust.is_owner(peer.uid, os.getuid())

    def _answer_now(self, req: p.Request) -> p.Reply | None:
        """Requests that need no waiting are answered inside the pump, in the same pass
        that read them: no task, no extra scheduler round (the frontend's acquire and
        release sit on every request's path). None = needs a task."""
        for answer in (self._engines_now, self._leases_now, self._daemon_now):
            reply = answer(req)
            if reply is not None:
                return reply
        return None

    def _engines_now(self, req: p.Request) -> p.Reply | None:
        """What the engines are (status, models, logs), and a keep-alive: all at once."""
        ops = self.ops
        match req:
            case p.Status(alias=alias):
                engines = ops.status(alias)
                if not self._by_owner():  # docs/security.md: secrets are the owner's
                    for info in engines:
                        info.argv = trust.hidden_argv(info.argv)
                return p.StatusReply(engines=engines, gateway=self._gateway())
            case p.Models():
                return p.ModelsReply(models=ops.models())
            case p.Logs(alias=alias, lines=lines, probes=probes):
                tail, upto = ops.logs(alias, lines, probes=probes)
                return p.LogsReply(alias=alias, lines=tail, upto=upto)
            case p.KeepAlive(model=model, seconds=seconds, forever=forever):
                return p.Ok(message=ops.keep_alive(model, seconds, forever=forever))
        return None

    def _leases_now(self, req: p.Request) -> p.Reply | None:
        """The frontends' leases, claims and reports, when the pool can answer them in this
        pass (an acquire or a claim that must wait, a parked sync: None)."""
        match req:
            case p.Acquire(model=model, client=client):
                now = self.pool.grant_now(model, client, claim=False)
                if now is None:
                    return None
                lease, engine = now
                return p.AcquireReply(
                    lease=lease, alias=engine.alias, url=engine.url or "", api_key=engine.api_key
                )
            case p.Release(lease=lease):
                found = self.pool.release(lease)
                return p.Ok(message="released" if found else "unknown lease (already expired)")
            case p.Heartbeat(client=client):
                self.pool.heartbeat(client)
                return p.Ok()
            case p.Claim(model=model, client=client):
                now = self.pool.grant_now(model, client, claim=True, pid=self._sender_pid())
                return None if now is None else self.pool.claim_reply(now[0])
            case p.Sync():
                # Recorded here, in the pass that read it: a heartbeat is never judged late
                # because its task had not run yet. None: parked (the long poll).
                return self.pool.sync(req, self._sender_pid())
            case p.Return(client=client, claim=claim):
                found = self.pool.give_back(client, claim)
                return p.Ok(message="returned" if found else "unknown claim (already gone)")
            case p.EngineKeys():
                return p.EngineKeysReply(keys=self.pool.engine_keys())
            case p.Usage(since=since, key=key):
                return p.UsageReply(rows=self.pool.usage.rows(since, key))
        return None

    def _daemon_now(self, req: p.Request) -> p.Reply | None:
        """The daemon's own: who it is, its schema, its shutdown, its pulls' table."""
        match req:
            case p.Ping():
                return p.Pong(
                    version=__version__,
                    pid=os.getpid(),
                    protocol=p.PROTOCOL,
                    features=list(p.FEATURES),
                )
            case p.Schema():
                return p.SchemaReply(protocol=p.PROTOCOL, schema=protocol_schema.current())
            case p.Shutdown():
                self._shutdown()
                return p.Ok(message="shutting down")
            case p.Pulls() if self._pulls is not None:
                return p.PullsReply(jobs=self._pulls.jobs())
            case p.PullCancel(name=name, repo=repo) if self._pulls is not None:
                return self._pulls.cancel(name, repo)
        return None

    async def _dispatch(self, req: p.Request, peer: Peer | None = None) -> p.Reply:
        """Requests that wait (a load may take minutes), each in a task of its own."""
        uid = peer.uid if peer is not None else None
        for later in (
            self._engines_later,
            self._config_later,
            self._leases_later,
            self._daemon_later,
        ):
            reply = await later(req, uid)
            if reply is not None:
                return reply
        raise ControlError(p.ErrorCode.BAD_REQUEST, f"unsupported request {type(req).__name__}")

    async def _engines_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """The engines' control operations: load (or its dry run), evict, sleep, wake."""
        ops = self.ops
        match req:
            case p.Load(alias=alias, dry_run=True):
                spec = self.pool.engine(alias).spec
                plan = await self._dry_run(alias)
                if not trust.is_owner(_asker(uid), os.getuid()):
                    plan = trust.hidden_launch(plan, spec)
                return p.PlanReply(plan=plan)
            case p.Load(alias=alias, wait=wait, timeout=timeout):
                return p.LoadReply(engine=await ops.load(alias, wait=wait, timeout=timeout))
            case p.Evict(alias=alias, all=all_, force=force, timeout=timeout):
                evicted = await ops.evict(alias, all=all_, force=force, timeout=timeout)
                return p.EvictReply(evicted=evicted)
            case p.Sleep(alias=alias, timeout=timeout):
                # Long (a drain, then SGLang's release): in a task, like load and evict.
                return p.LoadReply(engine=await ops.sleep(alias, timeout=timeout))
            case p.Wake(alias=alias, timeout=timeout):
                return p.LoadReply(engine=await ops.wake(alias, timeout=timeout))
            case p.EngineMemory(alias=alias):
                return await ops.engine_memory(alias)
        return None

    async def _config_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """A reload, and the config desk's requests. Who may read, plan and change:
        ``ConfigDesk.role`` (docs/security.md)."""
        desk, asker = self._config, _asker(uid)
        match req:
            case p.Reload():
                return p.Ok(message=await self._reload(Who(uid=uid)))
            case p.ConfigGet(seq=seq, delegated=delegated) if desk is not None:
                return await desk.get(seq, Who(uid=asker, delegated=delegated))
            case p.ConfigPlan(config_text=cfg, models_text=models, base=base) if desk is not None:
                who = Who(uid=asker, delegated=req.delegated)
                return p.ConfigPlanReply(plan=await desk.plan(cfg, models, base, who))
            case p.ConfigApply(config_text=cfg, models_text=models, base=base) if desk is not None:
                who = Who(uid=asker, claimed=req.author, delegated=req.delegated)
                return await desk.apply(cfg, models, base, who)
            case p.ConfigHistory() if desk is not None:
                return await desk.history_now()
            case p.ConfigRollback(seq=seq, base=base, dry_run=dry_run) if desk is not None:
                who = Who(uid=asker, claimed=req.author, delegated=req.delegated)
                return await desk.rollback(seq, base, who, dry_run=dry_run)
        return None

    async def _leases_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """An acquire or a claim that waits for its engine, a sync's long poll."""
        pool = self.pool
        match req:
            case p.Acquire(model=model, client=client, autoload=autoload, timeout=timeout):
                lease, engine = await pool.acquire(
                    model, client, autoload=autoload, timeout=timeout
                )
                return p.AcquireReply(
                    lease=lease, alias=engine.alias, url=engine.url or "", api_key=engine.api_key
                )
            case p.Claim(model=model, client=client, autoload=autoload, timeout=timeout):
                claim, _ = await pool.acquire(
                    model, client, autoload=autoload, timeout=timeout, claim=True
                )
                return pool.claim_reply(claim)
            case p.Sync(client=client, wait=wait):
                await pool.park(client, wait)
                return pool.sync_reply(client)
        return None

    async def _daemon_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """Doctor, the machine, the catalog and a pull: each reads files or runs tools."""
        match req:
            case p.Doctor():
                return p.DoctorReply(report=await self._doctor())
            case p.Machine() if self._machine is not None:
                return await self._machine()
            case p.Catalog(name=name) if self._catalog is not None:
                return await self._catalog(name)
            case p.Pull(name=name, repo=repo, dry_run=True) if self._pulls is not None:
                return await self._pulls.dry_run(name, repo)
            case p.Pull(name=name, repo=repo, force=force) if self._pulls is not None:
                # async: a catalog name is resolved off the event loop (files, nvidia-smi)
                return await self._pulls.request(name, repo, force=force)
        return None
