"""An in-test ktd for ktctl's unit tests: a ROUTER + XPUB served by one thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from ktctl.cli import main
from ktd import protocol as p

Answer = list[p.Reply | bytes] | str | None
Handler = Callable[[p.Request, "FakeDaemon"], Answer]


class FakeDaemon:
    """A ROUTER (control.sock) and an XPUB (events.sock) served by one thread.

    ``handler(request, daemon)`` returns the frames to send back (structs or raw
    bytes), None to stay silent, or ``"die"`` to close both sockets at once (a
    crashing daemon). It runs in the daemon thread, so it may ``publish``.
    """

    def __init__(self, directory: Path, handler: Handler, *, echo_ids: bool = False) -> None:
        self.path = directory / "control.sock"
        self.handler = handler
        self.echo_ids = echo_ids  # stamp each reply with the request's id
        self.requests: list[p.Request] = []
        self.outbox: queue.Queue[p.Event] = queue.Queue()
        self._stop = threading.Event()
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"ipc://{self.path}")
        self.pub = self.ctx.socket(zmq.XPUB)  # as ktd's: it greets each subscription
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_WELCOME_MSG, p.WELCOME)
        self.pub.bind(f"ipc://{directory / 'events.sock'}")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def publish(self, ev: p.Event) -> None:
        self.pub.send_multipart([ev.topic.encode(), msgspec.msgpack.encode(ev)])

    def _run(self) -> None:
        while not self._stop.is_set():
            while not self.outbox.empty():
                self.publish(self.outbox.get())
            while self.pub.poll(0):
                self.pub.recv()  # subscriptions: zmq keeps them, nobody reads them
            if not self.router.poll(20):
                continue
            ident, data = self.router.recv_multipart()
            req = p.decode_request(data)
            self.requests.append(req)
            answer = self.handler(req, self)
            if answer == "die":
                self.router.close(linger=0)
                self.pub.close(linger=0)
                return
            for item in answer if isinstance(answer, list) else []:
                if self.echo_ids and isinstance(item, p.Reply):
                    item.id = req.id
                frame = item if isinstance(item, bytes) else p.encode(item)
                self.router.send_multipart([ident, frame])

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.ctx.destroy(linger=0)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``ktctl ARGV`` in process: its exit code, what it printed and what it logged."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
