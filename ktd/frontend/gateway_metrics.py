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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart_trio import QuartTrio

from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError

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
        up = GaugeMetricFamily(
            "ktd_gateway_router_up", "1 while the sglang-router answers ktd.", labels=["router"]
        )
        fails = GaugeMetricFamily(
            "ktd_gateway_router_failures",
            "Consecutive failed syncs with the router (ktd backs off meanwhile).",
            labels=["router"],
        )
        added = CounterMetricFamily(
            "ktd_gateway_registrations", "Registrations ktd sent.", labels=["router"]
        )
        removed = CounterMetricFamily(
            "ktd_gateway_deregistrations", "Deregistrations ktd sent.", labels=["router"]
        )
        errors = CounterMetricFamily(
            "ktd_gateway_errors", "Failed calls to the router.", labels=["router"]
        )
        for r in reply.gateway.routers:
            up.add_metric([r.url], 1.0 if r.up else 0.0)
            fails.add_metric([r.url], r.failures)
            added.add_metric([r.url], r.added)
            removed.add_metric([r.url], r.removed)
            errors.add_metric([r.url], r.errors)
        registered = GaugeMetricFamily(
            "ktd_gateway_registered",
            "1 while the router lists the engine as registered by ktd (engines mode).",
            labels=["router", "model"],
        )
        for e in reply.engines:
            for reg in e.gateway:
                registered.add_metric(
                    [reg.router, e.alias], 1.0 if reg.state == "registered" else 0
                )
        yield from (up, fails, added, removed, errors, registered)


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
