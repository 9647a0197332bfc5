"""The floor of trio itself: an HTTP/1.1 relay on raw trio sockets, no Hypercorn.

``python bench/raw_relay.py HOST:PORT UPSTREAM_HOST:PORT [--stamps FILE]``

bench/proxy_stream.py measures it beside the frontend as ``relay``: what a
proxy written on trio adds to time to first byte before any HTTP server,
ASGI or ktd code is involved. It does the least a relay can: one upstream
keep-alive connection per client connection, the request passed on as read
(``content-length`` bodies only), the response bytes written back as they come
until the chunked terminator. Sends skip trio's checkpoint when the kernel
takes every byte (as the frontend's transport patch does), so the only
scheduler passes left are the waits for data.

``--stamps FILE``: on SIGTERM, write ``CLOCK_MONOTONIC`` stamps of every
request (request read, request sent upstream, then for each upstream read
the read and the write back) as JSON. ``time.perf_counter`` is that clock
in every process on Linux, so a client's own stamps line up with these: that
is how bench/RESULTS.md splits a relay's added TTFB into its own work and the
time its bytes wait for a CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import time
from pathlib import Path

import trio

_now = time.perf_counter
_END = b"0\r\n\r\n"


async def _send_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd)
            continue
        view = view[sent:]


async def _recv(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def _serve(
    upstream: tuple[str, int], stamps: list[list[float]] | None, client: trio.SocketStream
) -> None:
    up = trio.socket.socket()
    cfd, ufd = client.socket.fileno(), up.fileno()
    buf = b""
    try:
        await up.connect(upstream)
        while True:
            while b"\r\n\r\n" not in buf:
                data = await _recv(cfd)
                if not data:
                    return
                buf += data
            t_read = _now()
            head, _, rest = buf.partition(b"\r\n\r\n")
            n = _length(head)
            while len(rest) < n:
                data = await _recv(cfd)
                if not data:
                    return
                rest += data
            buf = rest[n:]
            await _send_all(ufd, head + b"\r\n\r\n" + rest[:n])
            mine = [t_read, _now()]
            tail = b""
            while not tail.endswith(_END):
                data = await _recv(ufd)
                if not data:
                    return
                mine.append(_now())
                await _send_all(cfd, data)
                mine.append(_now())
                tail = (tail + data)[-len(_END) :]
            if stamps is not None:
                stamps.append(mine)
    except OSError:
        return  # a peer went away (wrk closes its connections mid-stream at its end)
    finally:
        up.close()


async def main(bind: str, upstream: str, stamps: list[list[float]] | None) -> None:
    """Relay until SIGTERM or SIGINT."""
    host, port = bind.rsplit(":", 1)
    up_host, up_port = upstream.rsplit(":", 1)
    handler = functools.partial(_serve, (up_host, int(up_port)), stamps)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_tcp, handler, int(port), host=host))
            async for _ in signals:
                nursery.cancel_scope.cancel()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("bind")
    ap.add_argument("upstream")
    ap.add_argument("--stamps", type=Path)
    args = ap.parse_args()
    stamps: list[list[float]] | None = [] if args.stamps else None
    trio.run(main, args.bind, args.upstream, stamps)
    if args.stamps:
        args.stamps.write_text(json.dumps(stamps))
