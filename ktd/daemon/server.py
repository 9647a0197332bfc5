"""The control server: a ROUTER socket answering protocol requests, and the PUB socket.

Each request is handled in its own task (a ``load`` may wait minutes); the
socket itself is pumped by one task (``TrioSocket``). A frame that cannot be
decoded gets a ``bad_request`` reply; nothing a client sends can raise out of here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio
import zmq

from ktd import foreign
from ktd import protocol as p
from ktd.catalog.pulls import Puller
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import Frames, Peer, TrioSocket
from ktd.daemon.config.desk import ConfigDesk, Who
from ktd.daemon.dispatch import Dispatch, no_gateway
from ktd.daemon.pool.controls import Controls
from ktd.frameid import peek_id, skim_id

log = logging.getLogger("ktd.server")

_OPS = frozenset(str(t.__struct_config__.tag) for t in p.AnyRequest.__args__)


def _op_of(payload: bytes) -> str | None:
    """The ``op`` of a frame that decodes as msgpack but not as a request, if it is a string."""
    try:
        obj = foreign.msgpack_any(payload)
    except msgspec.DecodeError:
        return None
    op = obj.get("op") if isinstance(obj, dict) else None
    return op if isinstance(op, str) else None


def error_reply(req: p.Request, exc: Exception) -> p.Error:
    """ControlErrors carry their stable code; anything else is a bug, logged, never fatal."""
    if isinstance(exc, ControlError):
        return exc.to_reply()
    log.error("request %r failed", req, exc_info=exc)
    return p.Error(code=p.ErrorCode.INTERNAL, message=f"internal error: {exc!r}")


class ControlServer:
    """The control socket and the events socket; each request is answered by who
    ``Dispatch`` (``ktd.daemon.dispatch``) names."""

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
        gateway: Callable[[], p.GatewayInfo | None] = no_gateway,
        machine: Callable[[], Awaitable[p.MachineReply]] | None = None,
        config: ConfigDesk | None = None,
        catalog: Callable[[str | None], Awaitable[p.CatalogReply]] | None = None,
        pulls: Puller | None = None,
    ) -> None:
        # In field order: no two parts have the same type, so mypy holds the order.
        self.dispatch = Dispatch(
            ops, reload, doctor, dry_run, shutdown, gateway, machine, config, catalog, pulls
        )
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
        self._nursery: trio.Nursery | None = None
        self._encoder = msgspec.msgpack.Encoder()

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
            self.dispatch.pool.release(reply.lease)
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
            reply = self.dispatch.now(req, self.control.sender)
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
            reply = await self.dispatch.later(req, peer)
        except Exception as exc:  # the daemon never dies of a request
            reply = error_reply(req, exc)
        reply.id = req.id
        self._reply(envelope, reply)
