"""Trio-native control client (the frontend's link to the daemon).

One DEALER socket pumped by one task (``TrioSocket``); many concurrent callers
each wait on their own request id. A daemon restart is survived for free: zmq
reconnects the ipc socket, and requests in flight time out with ``Unreachable``.
With ``on_connect``, the socket's monitor (a PAIR socket, pumped by a task of its
own) says each time the connection is made again, so a caller whose request went
to a daemon that is gone need not wait out its timeout to send it anew.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import msgspec
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from ktd import protocol as p
from ktd.control.endpoint import check_reply, dealer
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import Frames, TrioSocket


class Unreachable(Exception):
    """No reply from the daemon in time: it is down, or not listening on that socket."""


class AsyncClient:
    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 5.0,
        on_connect: Callable[[], object] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._on_connect = on_connect
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[p.Reply]] = {}
        self._sock: TrioSocket | None = None

    def _on_message(self, frames: Frames) -> None:
        try:
            reply = p.decode_reply(frames[-1])
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
            return
        chan = self._waiting.pop(reply.id, None)
        if chan is None:
            # The caller timed out before the daemon answered. A lease granted
            # to nobody would keep the engine busy for as long as this client
            # heartbeats: give it back at once.
            if isinstance(reply, p.AcquireReply) and self._sock is not None:
                self._sock.send([p.encode(p.Release(id=0, lease=reply.lease))])
            return
        if chan is not None:
            try:
                chan.send_nowait(reply)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the socket pump until cancelled. Start with ``nursery.start(client.run)``."""
        raw = dealer(self._ctx)
        monitor = None
        if self._on_connect is not None:
            pair = raw.get_monitor_socket(zmq.EVENT_CONNECTED)
            monitor = TrioSocket(pair, self._on_monitor)
        raw.connect(self.endpoint)
        self._sock = TrioSocket(raw, self._on_message)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                if monitor is not None:
                    nursery.start_soon(monitor.run)
                await self._sock.run()
        finally:
            if monitor is not None:
                raw.disable_monitor()
                monitor.close()
            self._sock.close()
            self._sock = None

    def _on_monitor(self, frames: Frames) -> None:
        try:
            event = parse_monitor_message(frames)["event"]
        except (ValueError, KeyError, IndexError):
            return
        if event == zmq.EVENT_CONNECTED and self._on_connect is not None:
            self._on_connect()

    async def request(self, msg: p.Request, *, timeout: float | None = None) -> p.Reply:
        """Send and wait. ``timeout=math.inf`` waits forever (loads take minutes)."""
        if self._sock is None:
            raise Unreachable("control client is not running")
        msg.id = next(self._ids)
        frame = p.encode(msg)
        if len(frame) > p.MAX_FRAME:  # the daemon would refuse it (or zmq drop it) anyway
            raise ControlError(
                p.ErrorCode.BAD_REQUEST,
                f"request of {len(frame)} bytes exceeds the control API's {p.MAX_FRAME}",
            )
        send, recv = trio.open_memory_channel[p.Reply](1)
        self._waiting[msg.id] = send
        limit = self.timeout if timeout is None else timeout
        try:
            self._sock.send([frame])
            with trio.move_on_after(limit if math.isfinite(limit) else math.inf) as scope:
                reply = await recv.receive()
            if scope.cancelled_caught:
                raise Unreachable(f"no reply from ktd at {self.endpoint} within {limit:g}s")
        finally:
            self._waiting.pop(msg.id, None)
        return check_reply(reply, ControlError)
