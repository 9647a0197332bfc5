"""ktctl's connection to ktd's control socket: reachability, one request and its reply,
events, and the errors a client raises. ``ktctl.Client`` adds the operations on top.

Why a DEALER and never a REQ: a REQ socket that timed out waiting for a reply is
stuck in its send/receive lockstep forever; a DEALER can simply send the next
request, and replies are matched by request id (late replies of a timed-out
request are dropped on the floor).
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import socket as _socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import zmq

from ktctl.events import Closing, Subscription, slice_ms
from ktd import paths
from ktd import protocol as p
from ktd.control.endpoint import check_reply, control_path, dealer
from ktd.control.errors import ControlError
from ktd.frameid import peek_id

#: Extra time granted on top of a timeout the *daemon* enforces (load, evict,
#: sleep, wake, acquire): at its deadline the daemon may still tear an engine down (SIGTERM,
#: grace period, SIGKILL) before it answers, and that answer is worth waiting for.
DAEMON_GRACE = 30.0


START_HINT = "start it with `ktd serve` or `systemctl start ktd`, or try `ktd up --demo`"

R = TypeVar("R", bound=p.Reply)


class KtctlError(Exception):
    """Base of every error the client raises on purpose (the CLI maps them to exit codes)."""

    code = "error"


class UsageError(KtctlError):
    """A command line that cannot be carried out (exit 2, like argparse's)."""

    code = "usage"


class DaemonUnreachable(KtctlError):
    """ktd is not running, not listening on that socket, or did not answer in time."""

    code = "unreachable"


class ConnectionLost(DaemonUnreachable):
    """The daemon went away after the request was sent (it exited or restarted)."""


class ProtocolError(KtctlError):
    """ktd answered something this client does not understand (version skew?)."""

    code = "protocol"


class KtdError(KtctlError, ControlError):
    """ktd answered with an error reply; ``code`` is one of ``ktd.protocol.ErrorCode``.

    Scripts should match on ``code`` (stable), not on ``message`` (prose).
    """


# ---------------------------------------------------------------- reachability


def resolve_socket(socket: str | Path | None = None) -> Path:
    """The control socket path: the argument, else ``$KTD_SOCKET``, else the runtime dir."""
    return control_path(socket)


def _paired(req: p.Request, reply: p.Reply) -> p.Reply:
    """``reply`` if it is of a type that answers ``req`` (the protocol's table,
    ``p.REPLIES``: the schema's ``x-ktd-reply-types``), else ``ProtocolError``."""
    kinds = p.replies_to(req)
    if len(kinds) > 1 and not isinstance(reply, kinds):  # a request of the table
        expected = " or ".join(k.__name__ for k in kinds[:-1])
        raise ProtocolError(
            f"ktd answered {type(reply).__name__} to {type(req).__name__}, "
            f"where {expected} was expected"
        )
    return reply


def probe(path: Path, what: str = "control") -> None:
    """Raise ``DaemonUnreachable`` unless something is listening on the unix socket ``path``.

    zmq's ``connect`` never fails: pointed at a missing or stale ipc path it
    retries silently and a request would only time out after seconds. A plain
    ``AF_UNIX`` connect answers the question at once and precisely: no file, a
    stale file left by a dead daemon (connection refused), or no permission.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DaemonUnreachable(
            f"ktd is not running: no {what} socket at {path} ({START_HINT})"
        ) from None
    except PermissionError:
        raise _denied(path) from None
    except OSError as exc:
        raise DaemonUnreachable(f"cannot reach ktd at {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonUnreachable(f"cannot reach ktd: {path} is not a socket")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        # A full listen backlog makes a blocking connect wait; a busy daemon is
        # still a running daemon, so a slow connect counts as reachable.
        sock.settimeout(1.0)
        sock.connect(os.fspath(path))
    except ConnectionRefusedError:
        raise DaemonUnreachable(
            f"ktd is not running: {path} is a stale socket, nothing listens on it ({START_HINT})"
        ) from None
    except PermissionError:
        raise _denied(path) from None
    except (TimeoutError, BlockingIOError):
        return
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return
        raise DaemonUnreachable(f"cannot reach ktd at {path}: {exc.strerror or exc}") from None
    finally:
        sock.close()


def _denied(path: Path) -> DaemonUnreachable:
    return DaemonUnreachable(
        f"cannot reach ktd: permission denied on {path} (run as root or as a member of ktd's group)"
    )


# ---------------------------------------------------------------- connection


class Connection(Closing):
    """One synchronous connection to the daemon (see ``ktctl.Client``, which is one).

    Not thread-safe: use one per thread.
    """

    def __init__(self, socket: str | Path | None = None, *, timeout: float = 5.0) -> None:
        self.socket_path: Path = resolve_socket(socket)
        self.events_path: Path = paths.events_path(self.socket_path)
        self.timeout = timeout
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._ids = itertools.count(1)
        self._probed = False

    # ------------------------------------------------------------ plumbing

    def _context(self) -> zmq.Context[Any]:
        if self._ctx is None:
            self._ctx = zmq.Context()
        return self._ctx

    def _connect(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        if not self._probed:
            probe(self.socket_path)
            self._probed = True
        if self._sock is None or self._monitor is None:
            sock = dealer(self._context())
            # Disconnects are watched so that a wait with no overall limit (a
            # long load) ends when the daemon dies instead of hanging forever.
            self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(paths.endpoint(self.socket_path))
            self._sock = sock
        return self._sock, self._monitor

    def _drain_monitor(self, monitor: zmq.Socket[bytes]) -> bool:
        """Consume pending disconnect notifications; True if there was one."""
        seen = False
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return seen
            seen = True

    def _call(
        self,
        msg: p.Request,
        budget: float,
        *,
        sub: Subscription | None = None,
        on_event: Callable[[p.Event | None], None] | None = None,
    ) -> p.Reply:
        """Send ``msg`` and wait up to ``budget`` seconds (``inf``: no limit) for its reply.

        While waiting, events of ``sub`` are passed to ``on_event``, which is also
        called with None at least every POLL_SLICE so a display can tick.
        """
        sock, monitor = self._connect()
        req = msgspec.structs.replace(msg, id=next(self._ids))
        frame = p.encode(req)
        started = time.monotonic()
        deadline = started + budget
        self._drain_monitor(monitor)

        def tick() -> None:
            if on_event is not None:
                on_event(None)

        self._send(sock, frame, started, min(budget, self.timeout), tick)

        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        if sub is not None:
            poller.register(sub.socket, zmq.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DaemonUnreachable(
                    f"no reply from ktd at {self.socket_path} within {budget:g}s "
                    "(is it hung? check `systemctl status ktd`)"
                )
            ready = dict(poller.poll(slice_ms(remaining)))
            if sub is not None and sub.socket in ready:
                for ev in sub.drain():
                    if on_event is not None:
                        on_event(ev)
            if sock in ready:
                reply = self._read_reply(sock, req.id)
                if reply is not None:
                    return check_reply(_paired(req, reply), KtdError)
            if monitor in ready and self._drain_monitor(monitor):
                raise self._lost(time.monotonic() - started) from None
            tick()

    def _send(
        self,
        sock: zmq.Socket[bytes],
        frame: bytes,
        started: float,
        within: float,
        tick: Callable[[], None],
    ) -> None:
        """Send ``frame`` once the connection is made, or raise ``within`` seconds of
        ``started``.

        IMMEDIATE=1: the DEALER is writable only once the zmq handshake is done. A
        wedged daemon whose kernel socket still accepts never gets there, so this phase
        is bounded by the plain timeout even when the reply wait is not.
        """
        connect_by = started + within
        while not sock.poll(slice_ms(connect_by - time.monotonic()), zmq.POLLOUT):
            if time.monotonic() >= connect_by:
                probe(self.socket_path)  # gone since the last request? say so precisely
                raise DaemonUnreachable(
                    f"ktd did not accept a connection on {self.socket_path} "
                    f"within {within:g}s (is it hung?)"
                )
            tick()
        sock.send(frame, zmq.NOBLOCK)

    def _lost(self, waited: float) -> ConnectionLost:
        """The connection dropped during a reply wait of ``waited`` seconds.

        A daemon that exited (not restarted) is "not running", however late zmq noticed
        the disconnect: say that, precisely, if it is so.
        """
        lost = (
            f"lost the connection to ktd at {self.socket_path} while waiting "
            f"{waited:.1f}s for the reply"
        )
        try:
            probe(self.socket_path)
        except DaemonUnreachable as gone:
            return ConnectionLost(f"{lost}: {gone}")
        return ConnectionLost(f"{lost} (did ktd exit or restart?)")

    def _read_reply(self, sock: zmq.Socket[bytes], rid: int) -> p.Reply | None:
        """The queued reply with id ``rid``, if any; other ids are late replies, dropped."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            if not frames:
                continue
            data = frames[-1]
            try:
                reply = p.decode_reply(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                if peek_id(data) == rid:
                    raise ProtocolError(
                        f"ktd sent a reply this ktctl does not understand ({exc}); "
                        "are ktd and ktctl the same version?"
                    ) from None
                continue
            if reply.id == rid:
                return reply

    def _expect(self, reply: p.Reply, kind: type[R]) -> R:
        """``reply`` as the one of its request's reply types (``p.REPLIES``) the caller
        reads: ``_call`` has checked the pairing; this narrows it where a field of the
        request picks between two (``dry_run``)."""
        if not isinstance(reply, kind):
            raise ProtocolError(
                f"ktd answered {type(reply).__name__} where {kind.__name__} was expected"
            )
        return reply

    def _long(self, timeout: float | None) -> float:
        """Reply budget for an operation whose deadline the daemon enforces."""
        return math.inf if timeout is None else timeout + max(self.timeout, DAEMON_GRACE)

    # ------------------------------------------------------------ generic

    def request(self, msg: p.Request, *, timeout: float | None = None) -> p.Reply:
        """Send any request and return its reply (``Error`` replies raise ``KtdError``).

        ``timeout`` bounds the wait for the reply (default: the client's; ``math.inf``
        waits as long as the daemon stays connected). ``msg`` is not modified: the
        request id is assigned on a copy.
        """
        return self._call(msg, self.timeout if timeout is None else timeout)

    # ------------------------------------------------------------ events

    def subscribe(self, topics: Iterable[str] = ("",), *, exact: bool = False) -> Subscription:
        """A SUB socket on ``events.sock`` for these topic prefixes (exact topics with ``exact``).

        Raises ``DaemonUnreachable`` at once if the events socket is missing or stale.
        """
        probe(self.events_path, "events")
        return Subscription(self._context(), self.events_path, topics, exact=exact)

    def events(self, topics: Iterable[str] = ("",)) -> Iterator[p.Event]:
        """Every event whose topic starts with one of ``topics``, forever (``""``: all).

        Topics: ``engine.<alias>`` (state, reason, phase), ``log.<alias>``
        (lines), ``lease.<alias>`` (``in_flight``). The subscription is made before
        this returns, so events published after the call are not missed.
        """
        sub = self.subscribe(topics)

        def gen() -> Iterator[p.Event]:
            try:
                yield from sub
            finally:
                sub.close()

        return gen()

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close every socket of this client (subscriptions included) at once (LINGER 0)."""
        if self._sock is not None:
            self._sock.disable_monitor()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        self._ctx = self._sock = self._monitor = None
