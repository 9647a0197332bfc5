"""The engine hop: sockets and a keep-alive pool around the HTTP/1.1 codec (h1.py).

Why not httpx: the frontend talks to exactly one kind of server (SGLang's
uvicorn, or the sim) on 127.0.0.1, sends one POST and reads one response; the
general client cost more per chunk (anyio, httpcore's state machine, its pool
scan per request) than the whole rest of the proxy. Framing lives in the
sans-IO codec ``ktd.frontend.h1``; this module only moves bytes: it reads with
``recv(65536)`` and feeds the codec, so chunks that arrived together are handed
on together (coalescing costs no latency: it never waits for more data).

Connections are kept alive and reused (LIFO, so a few hot ones stay warm); an
idle one is dropped after ``idle_expiry`` seconds (below uvicorn's 5 s
keep-alive) or when a peek shows the server closed it. A request that fails on a
*reused* connection before a single response byte arrived is retried once on a
fresh one: that is the keep-alive race (the server closed just as we sent), not
an engine failure.

Sockets are plain non-blocking stdlib sockets driven with trio's
``wait_readable``/``wait_writable``: a read that finds data already there
costs one ``recv`` and no trip through the scheduler (trio's SocketStream
yields after every successful call); the read timeout's cancel scope exists
only while we actually wait.

Every request carries the engine's own API key (``Authorization: Bearer``, from
``EngineKeys``; the client's credentials never pass, proxy.py drops them): an
engine answers 401 to anyone without it. A 401 from the engine makes the pool ask
the daemon for the keys once and send again when the key changed (a new run on
the same port); the 401 comes from SGLang's middleware before anything ran.

Closing is synchronous (``Response.close``): a response read to its end returns
its connection to the pool, anything else closes the socket, which is how
SGLang learns that the client went away and aborts the generation. Being
synchronous it cannot be interrupted by a cancellation (httpx #3782, httpcore
#658 were leaks of exactly that kind).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import time
from urllib.parse import urlsplit

import trio
from trio.lowlevel import notify_closing, wait_readable, wait_writable

from ktd.frontend.enginekeys import KeyCache
from ktd.frontend.h1 import (
    END,
    NEED_DATA,
    BrokenResponse,
    Head,
    IncompleteMessage,
    ResponseParser,
    build_request,
)

RECV_SIZE = 65536


class UpstreamError(Exception):
    """The engine's HTTP exchange failed. ``kind`` is the metrics label."""

    kind = "broken"


class ConnectFailed(UpstreamError):
    kind = "connect"


class UpstreamTimeout(UpstreamError):
    kind = "timeout"


class _Retry(Exception):
    """A reused connection died before answering: try a fresh one."""


def _bad_response(exc: BrokenResponse) -> UpstreamError:
    if isinstance(exc, IncompleteMessage):
        return UpstreamError("the engine closed the connection before the response was complete")
    return UpstreamError(f"bad response from the engine: {exc}")


class _Conn:
    __slots__ = ("idle_since", "key", "reused", "sock", "timed_out", "wait_until", "watched")

    def __init__(self, key: tuple[str, int], sock: socket.socket) -> None:
        self.key = key
        self.sock = sock
        self.idle_since = 0.0
        self.reused = False
        # Read timeouts: with the pool's watchdog running (``watched``), a wait only
        # writes its deadline here and the watchdog closes the socket if it passes;
        # otherwise each wait gets its own cancel scope.
        self.watched = False
        self.wait_until = 0.0
        self.timed_out = False

    def close(self) -> None:
        """Sync and idempotent; wakes any task waiting on the socket (ClosedResourceError)."""
        if self.sock.fileno() >= 0:
            notify_closing(self.sock)
            self.sock.close()

    def looks_alive(self) -> bool:
        """An idle connection must have nothing to read: data or EOF means it is done."""
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False  # EOF (b"") or bytes nobody asked for: either way, not reusable

    async def recv(self, timeout: float | None) -> bytes:
        """Bytes from the socket (b"" = EOF), waiting at most ``timeout`` between reads."""
        sock = self.sock
        while True:
            try:
                return sock.recv(RECV_SIZE)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise self._broken(exc, timeout) from None
            try:
                if timeout is None:
                    await wait_readable(sock)
                elif self.watched:
                    self.wait_until = time.monotonic() + timeout
                    try:
                        await wait_readable(sock)
                    finally:
                        self.wait_until = 0.0
                else:
                    with trio.move_on_after(timeout) as scope:
                        await wait_readable(sock)
                    if scope.cancelled_caught:
                        raise UpstreamTimeout(f"no data from the engine for {timeout:g}s")
            except (trio.ClosedResourceError, OSError) as exc:
                raise self._broken(exc, timeout) from None

    def _broken(self, exc: BaseException, timeout: float | None) -> UpstreamError:
        if self.timed_out:
            return UpstreamTimeout(f"no data from the engine for {timeout or 0:g}s")
        return UpstreamError(f"connection to the engine broke: {exc!r}")

    async def send_all(self, data: bytes) -> None:
        sock = self.sock
        view = memoryview(data)
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await wait_writable(sock)
                continue
            view = view[sent:]


class Response:
    """The engine's answer: status and headers read, body read on demand."""

    __slots__ = ("_conn", "_parser", "_pool", "_timeout", "_unread", "done", "headers", "status")

    def __init__(
        self,
        pool: UpstreamPool,
        conn: _Conn,
        parser: ResponseParser,
        head: Head,
        timeout: float | None,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._parser = parser
        self.status = head.status
        self.headers = head.headers  # names lower-cased, values as sent
        self._timeout = timeout
        # Bytes that came with the head and the codec has not decoded yet. Once
        # it returned body data it has consumed all it could: the next read goes
        # straight to the socket (no decode call that can only say NEED_DATA).
        self._unread = True
        self.done = parser.complete

    @property
    def closed(self) -> bool:
        return self._conn is None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # ------------------------------------------------------------ reading

    async def receive(self) -> bytes:
        """The next body bytes available (everything buffered, decoded); b"" at the end.

        Returns as soon as there is anything to return: it never waits to fill.
        After a call, ``done`` tells whether the body is complete.
        """
        if self.done:
            return b""
        conn = self._conn
        if conn is None:
            raise UpstreamError("response already closed")
        parser = self._parser
        try:
            if self._unread:
                self._unread = False
                event = parser.next_event()
            else:
                event = NEED_DATA
            while event is NEED_DATA:
                parser.feed(await conn.recv(self._timeout))
                event = parser.next_event()
        except BrokenResponse as exc:
            raise _bad_response(exc) from None
        if event is END:
            self.done = True
            return b""
        self.done = parser.complete
        # Past its head the codec yields only bytes, END or NEED_DATA: no check per chunk.
        return event  # type: ignore[return-value]

    async def read(self) -> bytes:
        """The whole body (for non-streaming answers)."""
        parts = []
        while not self.done:
            data = await self.receive()
            if data:
                parts.append(data)
        return b"".join(parts)

    # ------------------------------------------------------------ end

    def close(self) -> None:
        """Give the connection back (body complete) or close it (anything else). Sync."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        self._pool.checkin(conn, reusable=self.done and self._parser.keep_alive)


class UpstreamPool:
    """Keep-alive connections to the engines, per (host, port)."""

    def __init__(
        self,
        *,
        read_timeout: float | None,
        connect_timeout: float = 5.0,
        write_timeout: float = 60.0,
        idle_expiry: float = 4.0,
        max_idle_per_host: int = 1024,
        keys: KeyCache | None = None,
    ) -> None:
        self.keys = keys if keys is not None else KeyCache()
        self.read_timeout = read_timeout or None
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self.idle_expiry = idle_expiry
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._watchdog = False
        self._wake: trio.Event | None = None  # set by the watchdog while it sleeps idle
        self._hosts: dict[str, tuple[tuple[str, int], bytes]] = {}
        self.active = 0
        self.closed = False

    def counts(self) -> tuple[int, int]:
        """(active, idle) connections."""
        return self.active, sum(len(v) for v in self._idle.values())

    def _target(self, base_url: str) -> tuple[tuple[str, int], bytes]:
        hit = self._hosts.get(base_url)
        if hit is None:
            url = urlsplit(base_url)
            if url.scheme != "http" or not url.hostname:
                raise ConnectFailed(f"unsupported engine URL {base_url!r}")
            port = url.port or 80
            host = url.hostname
            netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            hit = ((host, port), netloc.encode("ascii"))
            if len(self._hosts) > 256:
                self._hosts.clear()
            self._hosts[base_url] = hit
        return hit

    def _checkout(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        limit = time.monotonic() - self.idle_expiry
        while idle:
            conn = idle.pop()
            if conn.idle_since >= limit and conn.looks_alive():
                conn.reused = True
                return conn
            conn.close()
        return None

    def checkin(self, conn: _Conn, *, reusable: bool) -> None:
        """Take back a connection a response is done with: keep it idle, or close it.

        ``reusable``: the response was read to its end and the codec saw
        nothing that rules out another request (``Connection: close``, extra
        bytes). Sync, so a cancelled request cannot leak its socket.
        """
        self.active -= 1
        self._busy.discard(conn)
        if reusable and not self.closed:
            idle = self._idle.setdefault(conn.key, [])
            if len(idle) < self.max_idle_per_host:
                conn.idle_since = time.monotonic()
                idle.append(conn)
                return
        conn.close()

    def _busy_add(self, conn: _Conn) -> None:
        self.active += 1
        conn.watched = self._watchdog
        self._busy.add(conn)
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def watchdog(self) -> None:
        """Enforce read timeouts for every busy connection; run it in a task for the pool's life.

        Cheaper than a cancel scope per read: a read that has to wait just writes
        its deadline, and this task closes the socket of one that passed it (the
        reader then raises ``UpstreamTimeout``). Late by at most one tick; with no
        busy connection it sleeps until there is one (an idle frontend stays idle).
        """
        if self.read_timeout is None:
            return
        tick = min(1.0, self.read_timeout / 4)
        self._watchdog = True
        try:
            while True:
                if not self._busy:
                    self._wake = trio.Event()
                    await self._wake.wait()
                await trio.sleep(tick)
                now = time.monotonic()
                for conn in [c for c in self._busy if c.wait_until and c.wait_until <= now]:
                    conn.timed_out = True
                    conn.close()
        finally:
            self._watchdog = False
            self._wake = None
            for conn in self._busy:
                conn.watched = False

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        host, port = key
        try:
            with trio.fail_after(self.connect_timeout):
                family, addr = await self._resolve(host, port)
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    err = sock.connect_ex(addr)
                    if err in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                        await wait_writable(sock)
                        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, os.strerror(err))
                except BaseException:
                    notify_closing(sock)
                    sock.close()
                    raise
        except trio.TooSlowError:
            raise ConnectFailed(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from None
        return _Conn(key, sock)

    async def _resolve(self, host: str, port: int) -> tuple[int, tuple[str, int]]:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            if not infos:
                raise OSError(f"cannot resolve {host!r}") from None
            family, _, _, _, sockaddr = infos[0]
            return int(family), (str(sockaddr[0]), int(sockaddr[1]))
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return int(family), (host, port)

    async def request(
        self,
        base_url: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        method: bytes = b"POST",
    ) -> Response:
        """Send the request; return once the response's status and headers are in.

        The caller must ``close()`` the response (in a ``finally``).
        """
        if self.closed:
            raise ConnectFailed("upstream pool is closed")
        auth = self.keys.header(base_url)
        if auth is None:
            auth = await self.keys.header_for(base_url)
        response = await self._send(base_url, target, headers, body, method, auth)
        if response.status != 401:
            return response
        await self.keys.refresh(force=True)
        fresh = self.keys.header(base_url)
        if fresh is None or fresh == auth:
            return response
        response.close()
        return await self._send(base_url, target, headers, body, method, fresh)

    async def _send(
        self,
        base_url: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        method: bytes,
        auth: bytes | None,
    ) -> Response:
        key, netloc = self._target(base_url)
        if auth is not None:
            headers = [*headers, (b"authorization", auth)]
        try:
            head = build_request(method, target, netloc, headers, len(body))
        except ValueError as exc:
            raise UpstreamError(f"cannot send that request to the engine: {exc}") from None
        # A small body travels in the same segment as the head.
        payload = head + body if len(body) < 65536 else None
        conn = self._checkout(key)
        if conn is not None:
            self._busy_add(conn)
            try:
                return await self._exchange(conn, head, body, payload, method)
            except _Retry:
                pass
        conn = await self._connect(key)
        self._busy_add(conn)
        try:
            return await self._exchange(conn, head, body, payload, method)
        except _Retry:
            raise UpstreamError("the engine closed the connection without answering") from None

    async def _exchange(
        self, conn: _Conn, head: bytes, body: bytes, payload: bytes | None, method: bytes
    ) -> Response:
        ok = False
        try:
            try:
                with trio.fail_after(self.write_timeout):
                    if payload is not None:
                        await conn.send_all(payload)
                    else:
                        await conn.send_all(head)
                        await conn.send_all(body)
            except trio.TooSlowError:
                raise UpstreamTimeout("sending the request to the engine timed out") from None
            except (trio.ClosedResourceError, OSError) as exc:
                if conn.reused:
                    raise _Retry from None
                raise UpstreamError(f"sending to the engine failed: {exc}") from None
            response = await self._read_head(conn, ResponseParser(method))
            ok = True
            return response
        finally:
            if not ok:
                self.checkin(conn, reusable=False)

    async def _read_head(self, conn: _Conn, parser: ResponseParser) -> Response:
        """Wait for the final head (1xx interim answers are skipped)."""
        timeout = self.read_timeout
        answered = False  # any byte at all: after one, a failure is no keep-alive race
        while True:
            try:
                event = parser.next_event()
            except BrokenResponse as exc:  # EOF is never fed here: it is handled below
                raise _bad_response(exc) from None
            if isinstance(event, Head):
                return Response(self, conn, parser, event, timeout)
            if event is not NEED_DATA:
                continue  # 100 Continue and friends: the real answer follows
            try:
                data = await conn.recv(timeout)
            except UpstreamTimeout:
                raise UpstreamTimeout(f"no answer from the engine for {timeout:g}s") from None
            except UpstreamError:
                if conn.reused and not answered:
                    raise _Retry from None
                raise
            if not data:
                if conn.reused and not answered:
                    raise _Retry
                raise UpstreamError("the engine closed the connection without answering")
            answered = True
            parser.feed(data)

    def aclose_sync(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    async def aclose(self) -> None:
        self.aclose_sync()
        await trio.lowlevel.checkpoint()
