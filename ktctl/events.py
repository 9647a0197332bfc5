"""ktd's events (its XPUB socket) for ktctl and local tools: ``Client.subscribe``'s side.

Apart from the control client because a subscription is its own socket with its own
life (``ktctl events``, ``ktctl logs -f``, ``ktctl load``'s progress); zmq, msgspec
and ``ktd.protocol`` only, like the client, so ktctl starts fast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec
import zmq

from ktd import paths
from ktd import protocol as p

__all__ = ["POLL_SLICE", "SUBSCRIBE_SETTLE", "Closing", "Subscription", "slice_ms"]

#: Longest single blocking wait on a socket. Short so that Ctrl-C is honoured
#: promptly even while a multi-minute load is in progress.
POLL_SLICE = 0.2

#: How long ``subscribe`` waits for the SUB connection's handshake. PUB/SUB drops
#: whatever is published before the subscription reaches the publisher ("slow
#: joiner"), so the subscription is made to land before the request is sent.
SUBSCRIBE_SETTLE = 1.0


def slice_ms(seconds: float) -> int:
    """One poll slice in zmq's milliseconds: never longer than POLL_SLICE."""
    return max(0, int(min(seconds, POLL_SLICE) * 1000))


def _decode_event(frames: list[bytes]) -> p.Event | None:
    try:
        return p.decode_event(frames[-1])
    except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
        return None  # a newer daemon's event shape, or garbage: never fatal for a viewer


class Closing:
    """``with`` closes it: subscriptions and clients hold zmq sockets (LINGER 0)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---------------------------------------------------------------- events


class Subscription(Closing):
    """A SUB socket on ktd's events socket. Iterate it, or ``get(timeout)``.

    With ``exact=True`` only events whose topic is exactly one of ``topics`` are
    delivered: zmq subscriptions are prefixes, and ``log.deepseek`` must not see
    ``log.deepseek-v4-kt``'s lines.
    """

    def __init__(
        self, ctx: zmq.Context[Any], path: Path, topics: Iterable[str], *, exact: bool = False
    ) -> None:
        self.path = path
        self.topics = tuple(topics)
        self._exact = frozenset(t.encode() for t in self.topics) if exact else None
        self.socket: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        for topic in self.topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        # ktd greets each subscription (p.WELCOME): once that is in, so is the
        # subscription, and every event published from now on reaches us.
        self.socket.setsockopt(zmq.SUBSCRIBE, p.WELCOME)
        self.socket.connect(paths.endpoint(path))
        deadline = time.monotonic() + SUBSCRIBE_SETTLE
        self._early: list[list[bytes]] = []
        #: Greetings after the first (``gaps()``): the subscription was made again.
        self._greetings = 0
        self._gaps_seen = 0
        while (left := deadline - time.monotonic()) > 0 and self.socket.poll(slice_ms(left)):
            frames = self.socket.recv_multipart()
            if frames[0] == p.WELCOME:
                break
            self._early.append(frames)  # an event that overtook the greeting

    def gaps(self) -> int:
        """How many greetings the reads since the last call have seen: the subscription
        was made again (the daemon restarted or rebound its events socket; or its first
        greeting came late), so events published meanwhile may be missed. A caller that
        tracks a state reads it afresh (``Client.wait`` does)."""
        new = self._greetings - self._gaps_seen
        self._gaps_seen = self._greetings
        return new

    def get(self, timeout: float | None = None) -> p.Event | None:
        """The next event, or None after ``timeout`` seconds (None: wait forever)."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            ev = self._recv_nowait()
            if ev is not None:
                return ev
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.socket.poll(slice_ms(remaining))

    def drain(self) -> list[p.Event]:
        """Every event already queued, without waiting."""
        out: list[p.Event] = []
        while (ev := self._recv_nowait()) is not None:
            out.append(ev)
        return out

    def _recv_nowait(self) -> p.Event | None:
        while True:
            if self._early:
                frames = self._early.pop(0)
            else:
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return None
            if frames[0] == p.WELCOME:
                self._greetings += 1  # a new subscription: whatever came between is lost
                continue
            if self._exact is not None and frames[0] not in self._exact:
                continue
            ev = _decode_event(frames)
            if ev is not None:
                return ev

    def __iter__(self) -> Iterator[p.Event]:
        while True:
            ev = self.get(POLL_SLICE)
            if ev is not None:
                yield ev

    def close(self) -> None:
        self.socket.close(linger=0)
