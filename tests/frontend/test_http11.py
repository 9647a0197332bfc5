"""HTTP/1.1 on every path the frontend answers itself: the connection stays usable.

Raw sockets, because clients differ in how they split a request: httpx and the
openai SDK send the body in a packet after the headers, which is what left
keep-alive connections dead after a 404 or 401. Each test sends the body
later, or pipelines requests, and then expects the *next* answer on the same
connection; ``Connection: close`` is only acceptable when the body could not
be read.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import h11
import pytest
import trio

from tests.frontend.frontend_fakes import FakeDaemon, FakeEngine
from tests.frontend.frontend_helpers import Frontend, StartFrontend

CHAT = b'{"model": "m", "messages": []}'


class Conn:
    """One client connection that reads responses one by one (Content-Length framing)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    @classmethod
    async def open(cls, fe: Frontend) -> Conn:
        url = urlsplit(fe.url)
        assert url.hostname is not None and url.port is not None
        return cls(await trio.open_tcp_stream(url.hostname, url.port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        with trio.fail_after(15):
            while b"\r\n\r\n" not in self.buf:
                chunk = await self.stream.receive_some(65536)
                assert chunk, f"connection closed before a response; got {self.buf!r}"
                self.buf += chunk
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            while len(self.buf) < length:
                chunk = await self.stream.receive_some(65536)
                assert chunk, "connection closed mid-body"
                self.buf += chunk
            body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    async def aclose(self) -> None:
        await self.stream.aclose()


def post(path: str, body: bytes, *, extra: str = "", version: str = "1.1") -> tuple[bytes, bytes]:
    head = (
        f"POST {path} HTTP/{version}\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode()
    return head, body


GET_HEALTH = b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n"


def assert_openai(body: bytes) -> dict[str, object]:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "path", ["/v1/models", "/health", "/", "/no/such/route", "/v1/responses/x/y"]
)
async def test_split_body_on_an_unproxied_route_keeps_the_connection(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend, path: str
) -> None:
    fe = await start_frontend()
    conn = await Conn.open(fe)
    head, body = post(path, b'{"model": "m", "input": "hi"}')
    await conn.send(head)
    await trio.sleep(0.05)  # the body in a later packet, as httpx sends it
    await conn.send(body)
    await conn.send(GET_HEALTH)
    status, headers, data = await conn.response()
    assert status in (404, 405), data
    if path == "/":  # Ollama's root (ollama.py): its error shape
        assert set(json.loads(data)) == {"error"}
    else:
        assert_openai(data)
    assert headers.get("connection") != "close"
    status, _, data = await conn.response()
    assert status == 200, data
    await conn.aclose()


async def test_401_reads_the_body_and_keeps_the_connection(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend(api_keys=["sk-good"])
    conn = await Conn.open(fe)
    head, body = post("/v1/chat/completions", CHAT)
    await conn.send(head)
    await trio.sleep(0.05)
    await conn.send(body)
    status, headers, data = await conn.response()
    assert status == 401 and assert_openai(data)["code"] == "missing_api_key"
    assert headers.get("connection") != "close"
    head, body = post("/v1/chat/completions", CHAT, extra="authorization: Bearer sk-good\r\n")
    await conn.send(head + body)
    status, _, data = await conn.response()
    assert status == 200, data
    assert json.loads(data)["choices"][0]["message"]["content"] == "hello"
    await conn.aclose()


async def test_401_with_a_body_too_big_to_swallow_says_connection_close(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend
) -> None:
    fe = await start_frontend(api_keys=["sk-good"])
    conn = await Conn.open(fe)
    size = 3 << 20  # more than the frontend drains for a 401
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
        "content-type: application/json\r\n"
        f"content-length: {size}\r\n\r\n"
    ).encode()
    await conn.send(head)

    async def body() -> None:
        try:
            for _ in range(size // 65536):
                await conn.send(b" " * 65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server closed, as it said it would

    async with trio.open_nursery() as nursery:
        nursery.start_soon(body)
        status, headers, data = await conn.response()
        nursery.cancel_scope.cancel()
    assert status == 401 and assert_openai(data)
    assert headers.get("connection") == "close"
    await conn.aclose()


async def test_pipelined_requests_are_answered_in_order(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    conn = await Conn.open(fe)
    a = b"".join(post("/nope", b'{"x": 1}'))
    b = b"".join(post("/v1/chat/completions", CHAT))
    c = b"".join(post("/v1/chat/completions", b'{"messages": []}'))  # no model: 400
    await conn.send(a + b + c + GET_HEALTH)
    got = [(await conn.response())[0] for _ in range(4)]
    assert got == [404, 200, 400, 200]
    await conn.aclose()


async def test_odd_paths_and_deep_json_are_openai_errors_never_500(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    conn = await Conn.open(fe)
    # Repeated slashes are the route they look like.
    await conn.send(b"".join(post("//v1//chat/completions/", CHAT)))
    status, _, data = await conn.response()
    assert status == 200, data
    assert fake_engine.seen[-1].target == "/v1/chat/completions"
    for path in ("/v1/../v1/models", "/%00", "/v1/models/..%2f..", "/.well-known/x", "//", "/%ff"):
        await conn.send(f"GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n".encode())
        status, _, data = await conn.response()
        assert status in (200, 404), (path, data)
        if status == 404:
            assert_openai(data)
    await conn.aclose()
    async with fe.client() as client:
        deep = b'{"model": "m", "messages": [], "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
        resp = await client.post("/v1/chat/completions", content=deep)
        assert resp.status_code == 400, resp.text
        assert "nested too deeply" in str(assert_openai(resp.content)["message"])
        top = b"[" * 100_000 + b"]" * 100_000
        resp = await client.post("/v1/responses", content=top)
        assert resp.status_code == 400 and assert_openai(resp.content)


def _stream_request(version: str) -> bytes:
    head, body = post(
        "/v1/chat/completions",
        json.dumps({"model": "m", "stream": True, "messages": []}).encode(),
        version=version,
    )
    return head + body


def _dechunk(raw: bytes) -> tuple[bytes, bytes]:
    """A chunked body, every size line and CRLF checked: (the body, what follows it)."""
    body = b""
    while True:
        line, sep, raw = raw.partition(b"\r\n")
        assert sep, f"cut inside a chunk size line: {line[:40]!r}"
        size = int(line, 16)
        if size == 0:
            assert raw.startswith(b"\r\n"), raw[:40]  # no trailers: the blank line
            return body, raw[2:]
        assert raw[size : size + 2] == b"\r\n", raw[size : size + 8]
        body, raw = body + raw[:size], raw[size + 2 :]


async def test_a_streamed_body_is_framed_as_h11_would_and_the_connection_goes_on(
    fake_daemon: FakeDaemon,
    fake_engine: FakeEngine,
    start_frontend: StartFrontend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunks of a streamed answer skip h11 (ktd/frontend/transport.py): on the wire
    they are chunked exactly as h11 frames them, h11 still ends the message, and the
    connection serves the next request. Chunks that go h11's way are counted, so the
    test fails if the short path is not taken."""
    from hypercorn.protocol.h11 import H11Protocol

    through_h11: list[type] = []
    send_event = H11Protocol._send_h11_event

    async def counted(self: H11Protocol, event: object) -> None:
        through_h11.append(type(event))
        await send_event(self, event)  # type: ignore[arg-type]

    monkeypatch.setattr(H11Protocol, "_send_h11_event", counted)
    fake_engine.chunks = 6
    fake_engine.chunk_delay = 0.02  # one chunk per read: each is its own body message
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    conn = await Conn.open(fe)
    await conn.send(_stream_request("1.1"))
    raw = b""
    with trio.fail_after(15):
        while b"data: [DONE]" not in raw or not raw.endswith(b"0\r\n\r\n"):
            chunk = await conn.stream.receive_some(65536)
            assert chunk, raw[-200:]
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    body, after = _dechunk(rest)
    assert body == b"".join(fake_engine.events("m")) + b"data: [DONE]\n\n"
    assert after == b""
    assert h11.Data not in through_h11[:-2], through_h11  # the head, then at most the last
    assert through_h11.count(h11.Data) <= 1 and h11.EndOfMessage in through_h11
    await conn.send(GET_HEALTH)  # h11's state is where it would be: the next request
    status, _, data = await conn.response()
    assert status == 200, data
    await conn.aclose()


async def test_a_stream_to_an_http10_client_is_not_chunked(
    fake_daemon: FakeDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    """HTTP/1.0 has no chunked coding: the body goes as is and the close ends it (h11's
    own writer: the short path for chunks must not touch it)."""
    fake_engine.chunk_delay = 0.02
    fake_daemon.add("m", url=fake_engine.url, state="ready")
    fe = await start_frontend()
    conn = await Conn.open(fe)
    await conn.send(_stream_request("1.0"))
    raw = b""
    with trio.fail_after(15):
        while chunk := await conn.stream.receive_some(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower()
    assert body == b"".join(fake_engine.events("m")) + b"data: [DONE]\n\n"
    await conn.aclose()
