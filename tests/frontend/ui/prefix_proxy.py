"""A reverse proxy that mounts the frontend under a path prefix, as nginx would.

``python -m tests.frontend.ui.prefix_proxy /box unix:/path/fe.sock`` (or ``tcp:HOST:PORT``)
listens on a free port of 127.0.0.1 and prints ``{"port": N}``. A request for
``/box/ui`` reaches the frontend as ``/ui``; anything outside the prefix is a 404
from the proxy itself, so a page that asked for an absolute path would break here
as it would behind a real proxy. Each request gets its own upstream connection
(``Connection: close`` added); bytes are piped both ways, so streams stay streams.
"""

from __future__ import annotations

import json
import sys

import trio

MAX_HEAD = 64 << 10


async def _pipe(src: trio.abc.Stream, dst: trio.abc.Stream) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
        await dst.send_eof()  # type: ignore[attr-defined]
    except (trio.BrokenResourceError, trio.ClosedResourceError, AttributeError):
        pass


async def _connect(upstream: str) -> trio.abc.Stream:
    kind, _, where = upstream.partition(":")
    if kind == "unix":
        return await trio.open_unix_socket(where)
    host, _, port = where.rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


def rewrite(head: bytes, prefix: bytes) -> bytes | None:
    """The request head for the upstream, or None when the target is not under ``prefix``."""
    line, _, rest = head.partition(b"\r\n")
    method, target, version = line.split(b" ", 2)
    if not (
        target == prefix or target.startswith(prefix + b"/") or target.startswith(prefix + b"?")
    ):
        return None
    target = target[len(prefix) :] or b"/"
    if target.startswith(b"?"):
        target = b"/" + target
    headers = [h for h in rest.split(b"\r\n") if h and not h.lower().startswith(b"connection:")]
    return b"\r\n".join([b" ".join((method, target, version)), *headers, b"Connection: close"])


async def handle(client: trio.SocketStream, prefix: bytes, upstream: str) -> None:
    async with client:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await client.receive_some(65536)
            if not data or len(buf) > MAX_HEAD:
                return
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        new = rewrite(head, prefix)
        if new is None:
            await client.send_all(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found"
            )
            return
        server = await _connect(upstream)
        async with server:
            await server.send_all(new + b"\r\n\r\n" + body)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, server)
                await _pipe(server, client)
                nursery.cancel_scope.cancel()


async def main(prefix: str, upstream: str) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    print(json.dumps({"port": port}), flush=True)

    async def serve(stream: trio.SocketStream) -> None:
        await handle(stream, prefix.encode(), upstream)

    await trio.serve_listeners(serve, listeners)  # type: ignore[arg-type]


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
