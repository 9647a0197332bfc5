"""HTTP/2 on the frontend: one connection's protocol error ends that connection, never
the frontend.

sglang-router probes every worker it registers with a gRPC call, an HTTP/2
prior-knowledge connection (``PRI * HTTP/2.0``) that Hypercorn accepts. The frontend
answers the probe's path at once (it has no such route), without reading the request's
body; the body's DATA frame then arrives for a stream Hypercorn has closed, and
Hypercorn 0.18's HTTP/2 protocol raised ``KeyError`` for it out of the connection's
task group into the listener's nursery: the frontend process exited (seen in a clean
clone's run of ``tests/gateway/test_gateway_frontend.py``: host b's frontend died two
tenths of a second after it was registered, and its ktd took the registration back)."""

from __future__ import annotations

from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import trio

from tests.frontend.frontend_fakes import FakeDaemon
from tests.frontend.frontend_helpers import Frontend, StartFrontend

PROBE = [
    (":method", "POST"),
    (":scheme", "http"),
    (":authority", "localhost"),
    (":path", "/grpc.health.v1.Health/Check"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


async def _answered(stream: trio.SocketStream, conn: h2.connection.H2Connection) -> int:
    """Read until stream 1 has its whole response; its status."""
    status = 0
    with trio.fail_after(15):
        while True:
            data = await stream.receive_some(65536)
            assert data, "the frontend closed the connection before answering"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    return status
            await stream.send_all(conn.data_to_send())


async def _probe(fe: Frontend) -> trio.SocketStream:
    """The router's gRPC probe: headers, the answer, then the body for a closed stream."""
    url = urlsplit(fe.url)
    assert url.hostname is not None and url.port is not None
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, PROBE)
    await stream.send_all(conn.data_to_send())
    assert await _answered(stream, conn) == 404
    # The stream is closed on the server's side; h2's own state machine would refuse to
    # send on it now, so the DATA frame is written by hand: length 5, type 0 (DATA),
    # flags 1 (END_STREAM), stream 1, and a gRPC message header of an empty message.
    frame = (5).to_bytes(3, "big") + bytes([0, 1]) + (1).to_bytes(4, "big") + bytes(5)
    await stream.send_all(frame)
    return stream


async def test_a_body_for_a_stream_already_answered_ends_that_connection_only(
    fake_daemon: FakeDaemon, start_frontend: StartFrontend
) -> None:
    fe = await start_frontend()
    streams = [await _probe(fe) for _ in range(3)]
    await trio.sleep(0.2)  # what the frontend does with the stray frames, it has done
    async with fe.client() as c:
        r = await c.get("/health")
    assert r.status_code in (200, 503), r.text  # answered: the frontend is alive
    for s in streams:
        await s.aclose()
