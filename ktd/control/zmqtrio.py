"""A ZeroMQ socket driven by exactly one trio task.

pyzmq has no trio integration (trio #116, pyzmq #1827). The zmq FD is
edge-triggered: it signals only a change of ``EVENTS``, and any zmq call (even
``getsockopt(EVENTS)``) may consume the edge. So the pump task does all socket
I/O non-blockingly until ``zmq.Again``, re-reads ``EVENTS``, and only then waits
on the FD, as pyzmq's own ``_future.py`` does. Other tasks never touch the
socket: they put frames on an outbox and wake the pump by cancelling its wait,
so there is exactly one task per socket, and trio's one-waiter-per-fd rule holds.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import trio
import zmq

Frames = list[bytes]


class Peer(NamedTuple):
    """Who sent a message on an ipc socket: libzmq reads ``SO_PEERCRED`` of the
    connection and gives it as the message's ``Peer-Address`` (``...:uid:gid:pid``)."""

    uid: int
    gid: int
    pid: int


def peer_of(address: str | None) -> Peer | None:
    """The credentials in a ``Peer-Address`` property, or None (not ipc, not Linux)."""
    if not address:
        return None
    parts = address.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        return Peer(int(parts[1]), int(parts[2]), int(parts[3]))
    except ValueError:
        return None


def _sender(frame: zmq.Frame) -> Peer | None:
    try:
        address = frame.get("Peer-Address")
    except zmq.ZMQError:  # no such property on this transport
        return None
    return peer_of(address if isinstance(address, str) else None)


class TrioSocket:
    """Owns one zmq socket. Call ``run()`` in a task; ``send()`` from anywhere in trio."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        on_message: Callable[[Frames], None] | None,
        *,
        max_outbox: int = 100_000,
        on_drop: Callable[[Frames], None] | None = None,
        on_full: Callable[[Frames], None] | None = None,
        peers: bool = False,
    ) -> None:
        """``on_message=None`` for send-only sockets (PUB), which must never be read.

        ``on_drop``: told of every message that could not be sent (the outbox was
        full, or the peer is gone), so that nothing is lost without its owner knowing:
        a lease granted in an undeliverable reply, for one, is given back.

        ``on_full``: for a ROUTER with ``ROUTER_MANDATORY``, whose EAGAIN means that
        one peer's queue is at its high-water mark (it does not read): that message
        goes to ``on_full`` instead and the next is sent, so one client never holds
        up the replies to the others.

        ``peers``: each message's sender (``Peer``, from the kernel) is ``sender`` while
        ``on_message`` runs (the control socket records who changed the config; a
        microsecond or two per message: bench/RESULTS.md).
        """
        self.sock = sock
        self._on_message = on_message
        self._on_drop = on_drop
        self._outbox: deque[Frames] = deque()
        self._max_outbox = max_outbox
        self._wait_scope: trio.CancelScope | None = None
        self._closed = False
        self._rebind: tuple[str, int, trio.Event] | None = None
        self._on_full = on_full
        self.dropped = 0
        self._peers = peers
        self.sender: Peer | None = None

    def rebind(self, endpoint: str, *, umask: int) -> trio.Event:
        """Bind ``endpoint`` again (its ipc file was removed or replaced), creating it
        under ``umask``: done by the pump, the only code that calls into the socket. The
        event is set once the pump has bound it (the caller may then look at the file it
        made, and not at one someone put there a moment later)."""
        done = trio.Event()
        self._rebind = (endpoint, umask, done)
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        return done

    def send(self, frames: Frames) -> None:
        """Queue a multipart message; never blocks. Past ``max_outbox`` the oldest is dropped.

        Dropping beats blocking here: the pump serves every client, and one
        client that stopped reading must not stall replies to the others.
        """
        if self._closed:
            return
        if len(self._outbox) >= self._max_outbox:
            self._dropped(self._outbox.popleft())
        self._outbox.append(frames)
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def _flush(self) -> bool:
        """Send what the socket accepts now. True when the outbox is empty."""
        while self._outbox:
            frames = self._outbox[0]
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                if self._on_full is None:
                    return False
                self.dropped += 1
                self._on_full(self._outbox.popleft())  # that peer's queue is full
                continue
            except zmq.ZMQError as exc:
                # EHOSTUNREACH with ROUTER_MANDATORY and similar: the peer is gone.
                if exc.errno in (zmq.EHOSTUNREACH, zmq.ENOTSOCK, zmq.ETERM):
                    self._dropped(self._outbox.popleft())
                    continue
                raise
            self._outbox.popleft()
        return True

    def _dropped(self, frames: Frames) -> None:
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop(frames)

    def _drain_recv(self) -> list[tuple[Frames, Peer | None]]:
        got: list[tuple[Frames, Peer | None]] = []
        while True:
            try:
                if self._peers:
                    parts = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                    frames, peer = [f.bytes for f in parts], _sender(parts[-1])
                else:
                    frames, peer = self.sock.recv_multipart(flags=zmq.NOBLOCK), None
            except zmq.Again:
                return got
            got.append((frames, peer))
            if len(got) >= 256:
                # Yield to other tasks under a flood; EVENTS still says POLLIN.
                return got

    async def run(self) -> None:
        """The pump: the only code that calls into the zmq socket."""
        try:
            while True:
                if self._rebind is not None:
                    (endpoint, umask, done), self._rebind = self._rebind, None
                    with contextlib.suppress(zmq.ZMQError):
                        self.sock.unbind(endpoint)
                    old = os.umask(umask)
                    try:
                        self.sock.bind(endpoint)
                    finally:
                        os.umask(old)
                        done.set()
                # on_message must not block: handlers that take time spawn tasks.
                if self._on_message is not None:
                    for frames, peer in self._drain_recv():
                        self.sender = peer
                        try:
                            self._on_message(frames)
                        finally:
                            self.sender = None
                sent_all = self._flush()
                events = int(self.sock.getsockopt(zmq.EVENTS))
                readable = self._on_message is not None and events & zmq.POLLIN
                if readable or (not sent_all and events & zmq.POLLOUT):
                    await trio.lowlevel.checkpoint()
                    continue
                with trio.CancelScope() as scope:
                    self._wait_scope = scope
                    await trio.lowlevel.wait_readable(self.sock.FD)
                self._wait_scope = None
        finally:
            self._wait_scope = None
            self._closed = True

    def close(self, linger: int = 0) -> None:
        """Close the socket; call after ``run()`` has returned (its task is cancelled)."""
        self._closed = True
        if not self.sock.closed:
            trio.lowlevel.notify_closing(self.sock.FD)
            self.sock.close(linger=linger)
