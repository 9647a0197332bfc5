"""Prometheus view of ktd's gateway sync (``ktd_gateway_*``), on the frontend's ``/metrics``.

The daemon has no HTTP port; the frontend does, and already talks to the
daemon. A background task keeps the last ``status`` reply (cheap: answered
inline by the daemon) and a collector turns it into series at scrape time, so
a scrape never waits on the control socket. With no gateway configured there
are no series at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from quart_trio import QuartTrio

from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.frontend import promtable
from ktd.frontend.promtable import Family

if TYPE_CHECKING:
    from ktd.frontend.state import State

log = logging.getLogger("ktd.frontend.gateway")


class GatewayCollector(Collector):
    def __init__(self) -> None:
        self.status: p.StatusReply | None = None

    def collect(self) -> Iterator[Metric]:
        reply = self.status
        if reply is None or reply.gateway is None:
            return
        routers = [((r.url,), r) for r in reply.gateway.routers]
        yield from promtable.collect(ROUTER_FAMILIES, ["router"], routers)
        registrations = [((g.router, e.alias), g) for e in reply.engines for g in e.gateway]
        yield from promtable.collect((REGISTERED,), ["router", "model"], registrations)


#: Per router, read off the daemon's ``RouterInfo``.
ROUTER_FAMILIES = (
    Family("ktd_gateway_router_up", "1 while the sglang-router answers ktd.", lambda r: r.up),
    Family(
        "ktd_gateway_router_failures",
        "Consecutive failed syncs with the router (ktd backs off meanwhile).",
        lambda r: r.failures,
    ),
    Family("ktd_gateway_registrations", "Registrations ktd sent.", lambda r: r.added, counter=True),
    Family(
        "ktd_gateway_deregistrations",
        "Deregistrations ktd sent.",
        lambda r: r.removed,
        counter=True,
    ),
    Family("ktd_gateway_errors", "Failed calls to the router.", lambda r: r.errors, counter=True),
)

#: Per engine and router, read off the engine's registrations.
REGISTERED = Family(
    "ktd_gateway_registered",
    "1 while the router lists the engine as registered by ktd (engines mode).",
    lambda reg: reg.state == "registered",
)


def install(app: QuartTrio, state: State, *, interval: float = 5.0) -> None:
    collector = GatewayCollector()
    state.metrics.registry.register(collector)
    interval = max(interval, 5.0)  # a few seconds of lag is fine for these series

    async def refresh() -> None:
        while True:
            try:
                reply = await state.broker.request(p.Status(), timeout=interval)
                if isinstance(reply, p.StatusReply):
                    collector.status = reply
            except (Unreachable, ControlError) as exc:
                log.debug("gateway metrics: status failed: %s", exc)
                collector.status = None
            await trio.sleep(interval)

    @app.before_serving
    async def _start_gateway_metrics() -> None:
        app.nursery.start_soon(refresh)
