"""``ktd frontend`` with a clock on each phase of a request (bench/trace_request.py runs it).

Not part of the package: wrappers are put around the functions each phase ends
in, and every stamp is ``time.perf_counter()`` in this one process. Meant for
sequential requests (one at a time): the stamps of a request are the ones
between its bytes' arrival and the next request's. On SIGTERM the stamps go
to the JSON file named by ``KTD_TRACE_OUT``, one list per request of
``[phase, seconds]`` pairs in the order they happened.

Phases (the first stamp of each kind within a request counts):

* ``read``      Hypercorn's trio server handed the request's bytes to its h11 protocol
* ``app``       the ASGI app (the frontend's raw layer) was called
* ``body``      the request body was read (``receive()`` returned its end)
* ``slot``      the request had its slot on the claim (admission done)
* ``sent``      the request was written to the engine's socket
* ``head``      the engine's response head was parsed
* ``start``     the response head was handed to Hypercorn (``http.response.start``)
* ``chunk``     the first body bytes came from the engine
* ``out``       the first body bytes were written to the client's socket
* ``end``       the last body message was handed to Hypercorn
* ``idle``      Hypercorn restarted the connection's keep-alive timer (request over)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# The checkout to trace: this one, or another's (``KTD_TRACE_REPO``: trace_request.py --before).
sys.path.insert(0, os.environ.get("KTD_TRACE_REPO") or str(Path(__file__).resolve().parent.parent))

REQUESTS: list[list[tuple[str, float]]] = []
_now = time.perf_counter


def stamp(phase: str) -> None:
    if phase == "read" or not REQUESTS:
        if phase == "read" and REQUESTS and len(REQUESTS[-1]) == 1:
            return  # the same request's bytes in a second read
        REQUESTS.append([])
    current = REQUESTS[-1]
    if all(p != phase for p, _ in current):
        current.append((phase, _now()))


def _after(obj: Any, name: str, phase: str) -> None:
    original = getattr(obj, name)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        stamp(phase)
        return result

    setattr(obj, name, wrapper)


def install() -> None:
    from hypercorn.events import RawData
    from hypercorn.protocol import h11 as hh11

    from ktd.frontend import flow, proxy, transport, upstream

    try:
        from ktd.frontend import intake
    except ImportError:  # a checkout from before issue 22
        intake = None
    transport.install()
    if intake is not None:
        intake.install()

    handle = hh11.H11Protocol.handle

    async def traced_handle(self: Any, event: Any) -> None:
        if type(event) is RawData and event.data and self.stream is None:
            stamp("read")
        await handle(self, event)

    hh11.H11Protocol.handle = traced_handle  # type: ignore[method-assign]

    from hypercorn.trio import tcp_server

    send = tcp_server.TCPServer.protocol_send

    async def traced_send(self: Any, event: Any) -> None:
        await send(self, event)
        if type(event) is RawData and REQUESTS and any(p == "chunk" for p, _ in REQUESTS[-1]):
            stamp("out")

    tcp_server.TCPServer.protocol_send = traced_send  # type: ignore[method-assign]

    proxy_call = flow.Flow.proxy

    async def traced_proxy(self: Any, found: Any, scope: Any, receive: Any, send: Any) -> None:
        stamp("app")

        async def traced_receive() -> Any:
            message = await receive()
            if message.get("type") == "http.request" and not message.get("more_body"):
                stamp("body")
            return message

        async def traced_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                stamp("start")
            elif not message.get("more_body", False):
                stamp("end")
            await send(message)

        await proxy_call(self, found, scope, traced_receive, traced_send)

    flow.Flow.proxy = traced_proxy  # type: ignore[method-assign]

    got_slot = proxy.Exchange.got_slot

    def traced_got_slot(self: Any, slot: Any, waited: float) -> None:
        stamp("slot")
        got_slot(self, slot, waited)

    proxy.Exchange.got_slot = traced_got_slot  # type: ignore[method-assign]

    send_all = upstream._Conn.send_all

    async def traced_send_all(self: Any, data: bytes) -> None:
        await send_all(self, data)
        stamp("sent")

    upstream._Conn.send_all = traced_send_all  # type: ignore[method-assign]
    _after(flow, "read_body_in_time", "body")
    _after(upstream.UpstreamPool, "request", "head")
    _after(upstream.Response, "receive", "chunk")

    from hypercorn.trio.worker_context import TrioSingleTask

    timer: Any = intake.IdleTimer if intake is not None else TrioSingleTask
    restart = timer.restart

    async def traced_restart(self: Any, *args: Any) -> None:
        if REQUESTS and any(p == "end" for p, _ in REQUESTS[-1]):
            stamp("idle")
        await restart(self, *args)

    timer.restart = traced_restart


def _dump(*_: object) -> None:
    out = os.environ.get("KTD_TRACE_OUT")
    if out:
        Path(out).write_text(json.dumps(REQUESTS))


if __name__ == "__main__":
    install()
    from ktd.frontend.main import main

    profile = os.environ.get("KTD_TRACE_PROFILE")
    try:
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            code = profiler.runcall(main, sys.argv[1:])
            profiler.dump_stats(profile)
        else:
            code = main(sys.argv[1:])
    finally:
        _dump()
    sys.exit(code)
