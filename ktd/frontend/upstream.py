"""The engine hop: a small pooled HTTP/1.1 client on raw trio socket streams.

Why not httpx: the frontend talks to exactly one kind of server (SGLang's
uvicorn, or the sim) on 127.0.0.1, sends one POST and reads one response; the
general client cost more per chunk (anyio, httpcore's state machine, its pool
scan per request) than the whole rest of the proxy. This client parses only the
status line, the headers and the chunked framing, and reads with
``recv(65536)``: chunks that arrived together are handed on together
(coalescing costs no latency: it never waits for more data).

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

RECV_SIZE = 65536
MAX_HEAD = 64 * 1024  # status line + headers
MAX_CHUNK_LINE = 4096


class UpstreamError(Exception):
    """The engine's HTTP exchange failed. ``kind`` is the metrics label."""

    kind = "broken"


class ConnectFailed(UpstreamError):
    kind = "connect"


class UpstreamTimeout(UpstreamError):
    kind = "timeout"


class _Retry(Exception):
    """A reused connection died before answering: try a fresh one."""


# Body framing
_CHUNKED = 1
_LENGTH = 2
_EOF = 3  # no length, no chunking: the body ends when the server closes

# Chunked decoder states
_SIZE = 0
_DATA = 1
_CRLF = 2
_TRAILER = 3


class _Conn:
    __slots__ = ("buf", "idle_since", "key", "reused", "sock", "timed_out", "wait_until", "watched")

    def __init__(self, key: tuple[str, int], sock: socket.socket) -> None:
        self.key = key
        self.sock = sock
        self.buf = bytearray()
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

    __slots__ = (
        "_conn",
        "_keep",
        "_pool",
        "_remaining",
        "_state",
        "_timeout",
        "done",
        "framing",
        "headers",
        "status",
    )

    def __init__(
        self,
        pool: Pool,
        conn: _Conn,
        status: int,
        headers: list[tuple[bytes, bytes]],
        framing: int,
        length: int,
        keep: bool,
        timeout: float | None,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers  # names lower-cased, values as sent
        self.framing = framing
        self._remaining = length
        self._state = _SIZE
        self._keep = keep
        self._timeout = timeout
        self.done = framing == _LENGTH and length == 0

    @property
    def closed(self) -> bool:
        return self._conn is None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    # ------------------------------------------------------------ reading

    async def _fill(self, conn: _Conn) -> bool:
        """Read more bytes into the buffer; False on EOF."""
        data = await conn.recv(self._timeout)
        if not data:
            return False
        conn.buf += data
        return True

    async def receive(self) -> bytes:
        """The next body bytes available (everything buffered, decoded); b"" at the end.

        Returns as soon as there is anything to return: it never waits to fill.
        After a call, ``done`` tells whether the body is complete.
        """
        while not self.done:
            conn = self._conn
            if conn is None:
                raise UpstreamError("response already closed")
            if conn.buf:
                out = self._decode(conn.buf)
                if out or self.done:
                    return out
            if not await self._fill(conn):
                if self.framing == _EOF:
                    self.done = True
                    self._keep = False
                    return b""
                raise UpstreamError(
                    "the engine closed the connection before the response was complete"
                )
        return b""

    async def read(self) -> bytes:
        """The whole body (for non-streaming answers)."""
        parts = []
        while not self.done:
            data = await self.receive()
            if data:
                parts.append(data)
        return b"".join(parts)

    def _decode(self, buf: bytearray) -> bytes:
        """Consume what ``buf`` holds; return the body bytes in it."""
        if self.framing != _CHUNKED:
            if self.framing == _EOF:
                out = bytes(buf)
                buf.clear()
                return out
            n = min(self._remaining, len(buf))
            out = bytes(buf[:n])
            del buf[:n]
            self._remaining -= n
            if not self._remaining:
                self.done = True
                if buf:  # the server sent more than it announced: do not reuse
                    self._keep = False
            return out
        parts: list[bytes | bytearray] = []
        pos = 0
        end = len(buf)
        state = self._state
        while pos < end:
            if state == _DATA:
                n = min(self._remaining, end - pos)
                parts.append(buf[pos : pos + n])
                pos += n
                self._remaining -= n
                if self._remaining:
                    break
                state = _CRLF
            elif state == _CRLF:
                if end - pos < 2:
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    raise UpstreamError("bad chunked encoding from the engine (no CRLF)")
                pos += 2
                state = _SIZE
            elif state == _SIZE:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if end - pos > MAX_CHUNK_LINE:
                        raise UpstreamError("bad chunked encoding from the engine (size line)")
                    break
                line = bytes(buf[pos:i]).split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    size = -1
                if size < 0 or not line or len(line) > 16:
                    raise UpstreamError(f"bad chunk size from the engine: {line[:20]!r}")
                pos = i + 2
                if size:
                    self._remaining = size
                    state = _DATA
                else:
                    state = _TRAILER
            else:  # trailers until an empty line
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if end - pos > MAX_HEAD:
                        raise UpstreamError("trailers from the engine are too large")
                    break
                if i == pos:
                    pos += 2
                    self.done = True
                    break
                pos = i + 2
        self._state = state
        if pos == end:
            buf.clear()
        else:
            del buf[:pos]
            if self.done:
                self._keep = False  # bytes after the end: not ours to guess
        if not parts:
            return b""
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    # ------------------------------------------------------------ end

    def close(self) -> None:
        """Give the connection back (body complete) or close it (anything else). Sync."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        self._pool._release(conn, reuse=self.done and self._keep)


class Pool:
    """Keep-alive connections per (host, port)."""

    def __init__(
        self,
        *,
        read_timeout: float | None,
        connect_timeout: float = 5.0,
        write_timeout: float = 60.0,
        idle_expiry: float = 4.0,
        max_idle_per_host: int = 1024,
    ) -> None:
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

    def _release(self, conn: _Conn, *, reuse: bool) -> None:
        self.active -= 1
        self._busy.discard(conn)
        if reuse and not self.closed and not conn.buf:
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
        key, netloc = self._target(base_url)
        lines = [method, b" ", target, b" HTTP/1.1\r\nhost: ", netloc]
        lines.append(b"\r\ncontent-length: ")
        lines.append(str(len(body)).encode())
        lines.append(b"\r\naccept-encoding: identity")
        for name, value in headers:
            lines += (b"\r\n", name, b": ", value)
        lines.append(b"\r\n\r\n")
        head = b"".join(lines)
        # A small body travels in the same segment as the head.
        payload = head + body if len(body) < 65536 else None
        conn = self._checkout(key)
        if conn is not None:
            self._busy_add(conn)
            try:
                return await self._exchange(conn, head, body, payload)
            except _Retry:
                pass
        conn = await self._connect(key)
        self._busy_add(conn)
        try:
            return await self._exchange(conn, head, body, payload)
        except _Retry:
            raise UpstreamError("the engine closed the connection without answering") from None

    async def _exchange(
        self, conn: _Conn, head: bytes, body: bytes, payload: bytes | None
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
            response = await self._read_head(conn)
            ok = True
            return response
        finally:
            if not ok:
                self._release(conn, reuse=False)

    async def _read_head(self, conn: _Conn) -> Response:
        timeout = self.read_timeout
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buf[:end])
                del buf[: end + 4]
                status, headers = _parse_head(head)
                if 100 <= status < 200:
                    continue  # 100 Continue and friends: the real answer follows
                break
            if len(buf) > MAX_HEAD:
                raise UpstreamError("response head from the engine is too large")
            try:
                data = await conn.recv(timeout)
            except UpstreamTimeout:
                raise UpstreamTimeout(f"no answer from the engine for {timeout:g}s") from None
            except UpstreamError:
                if conn.reused and not buf:
                    raise _Retry from None
                raise
            if not data:
                if conn.reused and not buf:
                    raise _Retry
                raise UpstreamError("the engine closed the connection without answering")
            buf += data
        framing = _EOF
        length = 0
        keep = True
        for name, value in headers:
            if name == b"transfer-encoding":
                if value.strip().lower().endswith(b"chunked"):
                    framing = _CHUNKED
            elif name == b"content-length" and framing != _CHUNKED:
                try:
                    length = int(value)
                except ValueError:
                    raise UpstreamError(f"bad content-length from the engine: {value!r}") from None
                framing = _LENGTH
            elif name == b"connection" and b"close" in value.lower():
                keep = False
        if status in (204, 304):
            framing, length = _LENGTH, 0
        if framing == _EOF:
            keep = False
        return Response(self, conn, status, headers, framing, length, keep, timeout)

    def aclose_sync(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    async def aclose(self) -> None:
        self.aclose_sync()
        await trio.lowlevel.checkpoint()


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise UpstreamError(f"bad status line from the engine: {lines[0][:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise UpstreamError(f"bad status line from the engine: {lines[0][:80]!r}") from None
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise UpstreamError(f"bad header line from the engine: {line[:80]!r}")
        headers.append((name.lower(), value.strip()))
    if parts[0] == b"HTTP/1.0":
        headers.append((b"connection", b"close"))
    return status, headers
