"""The frontend's HTTP/1.1 client for the engine hop (ktd.frontend.upstream).

A scripted raw-socket server plays the engine, so framing can be cut at every
byte boundary and connections can be dropped exactly where a test wants.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from ktd.frontend.upstream import ConnectFailed, UpstreamError, UpstreamPool, UpstreamTimeout

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]

HEAD_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunked(*parts: bytes) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return out + b"0\r\n\r\n"


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        more = await stream.receive_some(65536)
        if not more:
            return b""
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + rest


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.port = 0

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
        n = self.connections
        try:
            await self.handler(stream, n)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


async def serve(nursery: trio.Nursery, handler: Handler) -> Server:
    server = Server(handler)
    await nursery.start(server.run)
    return server


HEADERS = [(b"content-type", b"application/json")]


async def test_chunked_body_split_boundaries(nursery: trio.Nursery) -> None:
    """Every split point of the body, each on a fresh exchange."""
    body = chunked(b"data: a\n\n", b"data: bb\n\n", b"data: [DONE]\n\n")
    raw = HEAD_CHUNKED + body
    cuts = list(range(len(HEAD_CHUNKED), len(raw)))
    state = {"i": 0}

    async def handler(stream: trio.SocketStream, n: int) -> None:
        while await read_request(stream):
            cut = cuts[state["i"]]
            state["i"] += 1
            await stream.send_all(raw[:cut])
            await trio.sleep(0.001)
            await stream.send_all(raw[cut:])

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    for _ in cuts:
        resp = await pool.request(server.url, b"/v1/x", HEADERS, b"{}")
        got = []
        while not resp.done:
            got.append(await resp.receive())
        resp.close()
        assert b"".join(got) == b"data: a\n\ndata: bb\n\ndata: [DONE]\n\n"
    assert server.connections == 1  # one keep-alive connection for all of them
    assert pool.counts() == (0, 1)


async def test_chunks_that_arrived_together_come_out_together(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + chunked(*[b"data: %d\n\n" % i for i in range(50)]))

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    resp = await pool.request(server.url, b"/v1/x", HEADERS, b"{}")
    first = await resp.receive()
    assert first.count(b"data: ") == 50 and resp.done
    resp.close()


async def test_content_length_and_request_bytes(nursery: trio.Nursery) -> None:
    seen: list[bytes] = []

    async def handler(stream: trio.SocketStream, n: int) -> None:
        while req := await read_request(stream):
            seen.append(req)
            await stream.send_all(b"HTTP/1.1 400 Bad\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nnope!")

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    resp = await pool.request(
        server.url, b"/v1/chat/completions?x=1", [(b"x-request-id", b"r1")], b'{"a": 1}'
    )
    assert resp.status == 400
    assert resp.header(b"x-a") == b"1"
    assert await resp.read() == b"nope!"
    resp.close()
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?x=1 HTTP/1.1"
    assert b"content-length: 8" in lines and b"x-request-id: r1" in lines
    assert body == b'{"a": 1}'


async def test_stale_keepalive_connection_is_retried_once(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        # ... and then the server drops the kept-alive connection (its idle timeout)

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    for _ in range(3):
        resp = await pool.request(server.url, b"/", HEADERS, b"{}")
        assert await resp.read() == b"ok"
        resp.close()
        await trio.sleep(0.05)  # let the close reach us (or not: both paths must work)
    assert server.connections == 3


async def test_server_closing_after_reading_the_request_on_reuse(nursery: trio.Nursery) -> None:
    """The keep-alive race: the request went out, the server had already closed."""

    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        if n == 1:
            await read_request(stream)  # swallow the second request, answer nothing

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    for _ in range(2):
        resp = await pool.request(server.url, b"/", HEADERS, b"{}")
        assert await resp.read() == b"ok"
        resp.close()
    assert server.connections == 2


async def test_engine_dying_mid_body_is_an_upstream_error(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + b"9\r\ndata: one\r\n5\r\ndata:\r\n")

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    resp = await pool.request(server.url, b"/", HEADERS, b"{}")
    got = b""
    with pytest.raises(UpstreamError) as info:
        while not resp.done:
            got += await resp.receive()
    resp.close()
    assert got == b"data: onedata:"
    assert info.value.kind == "broken"
    assert pool.counts() == (0, 0)  # a broken connection is never pooled


async def test_bad_framing_is_an_upstream_error(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + b"zz\r\nhello\r\n")
        await trio.sleep(1)

    server = await serve(nursery, handler)
    resp = await UpstreamPool(read_timeout=5).request(server.url, b"/", HEADERS, b"{}")
    with pytest.raises(UpstreamError, match="chunk size"):
        await resp.read()
    resp.close()


async def test_read_timeout_enforced_by_the_watchdog(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + b"9\r\ndata: one\r\n")
        await trio.sleep(1)
        await stream.send_all(b"9\r\ndata: two\r\n")
        await trio.sleep(5)

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=2.0)
    nursery.start_soon(pool.watchdog)
    await trio.testing.wait_all_tasks_blocked()
    assert pool._watchdog  # reads now only write their deadline, no cancel scope
    resp = await pool.request(server.url, b"/", HEADERS, b"{}")
    assert await resp.receive() == b"data: one"
    assert await resp.receive() == b"data: two"  # 1 s of silence is within the timeout
    t0 = trio.current_time()
    with pytest.raises(UpstreamTimeout):
        await resp.receive()
    assert 2.0 <= trio.current_time() - t0 < 3.0
    resp.close()
    assert pool.counts() == (0, 0)


async def test_read_timeout_and_connect_failure(nursery: trio.Nursery) -> None:
    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + chunked(b"data: x\n\n")[:-5])
        await trio.sleep(5)

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=0.2)
    resp = await pool.request(server.url, b"/", HEADERS, b"{}")
    assert await resp.receive() == b"data: x\n\n"
    with pytest.raises(UpstreamTimeout):
        await resp.receive()
    resp.close()
    with pytest.raises(ConnectFailed):
        await pool.request("http://127.0.0.1:9", b"/", HEADERS, b"{}")
    assert pool.counts() == (0, 0)


async def test_unfinished_response_closes_its_connection(nursery: trio.Nursery) -> None:
    hung_up = trio.Event()

    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(HEAD_CHUNKED + b"9\r\ndata: one\r\n")
        if not await stream.receive_some(10):
            hung_up.set()

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    resp = await pool.request(server.url, b"/", HEADERS, b"{}")
    assert await resp.receive() == b"data: one"
    assert pool.counts() == (1, 0)
    resp.close()  # synchronous: nothing to cancel halfway
    assert pool.counts() == (0, 0)
    with trio.fail_after(2):
        await hung_up.wait()


async def test_head_request_and_connection_close(nursery: trio.Nursery) -> None:
    """HEAD: no body whatever the length says (reused); ``connection: close``: not pooled."""

    async def handler(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"
        )
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
        )
        await trio.sleep(1)

    server = await serve(nursery, handler)
    pool = UpstreamPool(read_timeout=5)
    resp = await pool.request(server.url, b"/", [], b"", method=b"HEAD")
    assert resp.status == 200 and resp.done
    assert await resp.read() == b""
    resp.close()
    assert pool.counts() == (0, 1)
    resp = await pool.request(server.url, b"/", [], b"", method=b"GET")
    assert await resp.read() == b"ok"
    resp.close()
    assert pool.counts() == (0, 0)
    assert server.connections == 1
