"""Prometheus metrics of the frontend.

Each app gets its own registry (tests run several apps in one process, and the
global registry would mix them). Label values are bounded: ``model`` is a
configured alias or one of the placeholders below, never a string a client
made up, so a scanner cannot blow up the series count.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Placeholder model labels for requests that never reached a configured model.
NO_MODEL = "_none"  # bad body, bad key: no model to speak of
UNKNOWN_MODEL = "_unknown"  # a name the daemon does not know

# Loads take minutes: the load-wait buckets reach the 30 min default deadline.
_LOAD_BUCKETS = (0.005, 0.05, 0.25, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, float("inf"))
_TTFB_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    float("inf"),
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ktd_frontend_requests",
            "Requests finished, by endpoint, model and HTTP status (for a stream that "
            "already answered 200, the status its in-band error stands for).",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "ktd_frontend_requests_in_flight", "Proxied requests in progress.", registry=r
        )
        self.ttfb = Histogram(
            "ktd_frontend_time_to_first_byte_seconds",
            "From request arrival to the first byte of the engine's answer sent to "
            "the client (includes any load wait).",
            ["model"],
            buckets=_TTFB_BUCKETS,
            registry=r,
        )
        self.load_wait = Histogram(
            "ktd_frontend_load_wait_seconds",
            "Time a request waited for the daemon to grant an engine (load on demand).",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "ktd_frontend_upstream_errors",
            "Engine HTTP failures: connect, timeout, or broken mid-response.",
            ["model", "kind"],
            registry=r,
        )
        self.daemon_errors = Counter(
            "ktd_frontend_daemon_unreachable",
            "Control requests to the daemon that got no reply in time.",
            registry=r,
        )

    def add_pool_gauge(self, count: Callable[[], tuple[int, int]]) -> None:
        """Export upstream connection-pool occupancy, read at scrape time only."""
        active = Gauge(
            "ktd_frontend_upstream_connections",
            "Upstream HTTP connections in the pool, by state.",
            ["state"],
            registry=self.registry,
        )
        active.labels("active").set_function(lambda: count()[0])
        active.labels("idle").set_function(lambda: count()[1])

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
