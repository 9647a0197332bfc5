"""Prometheus metrics of the frontend.

Each app gets its own registry (tests run several apps in one process, and the
global registry would mix them). Label values are bounded: ``model`` is a
configured alias or one of the placeholders below, never a string a client
made up, so a scanner cannot blow up the series count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from ktd.core import states as S
from ktd.core.budget import Budget
from ktd.frontend import promtable
from ktd.frontend.promtable import Family
from ktd.frontend.tally import Tokens

# Placeholder model labels for requests that never reached a configured model.
NO_MODEL = "_none"  # bad body, bad key: no model to speak of
UNKNOWN_MODEL = "_unknown"  # a name the daemon does not know
NO_KEY = "_none"  # the key label of requests on a frontend without keys

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


#: The per-key counters (``Metrics.key_requests``, ``key_errors``, ``key_tokens``):
#: name, help, labels.
_KEY_SERIES = (
    (
        "ktd_key_requests",
        "Requests that reached a model, by API key name and model.",
        ["key", "model"],
    ),
    (
        "ktd_key_errors",
        "Of those, the ones answered with an error status (but 499, the client gone).",
        ["key", "model"],
    ),
    (
        "ktd_key_tokens",
        "Tokens the engine reported for a key's requests: kind prompt or completion.",
        ["key", "model", "kind"],
    ),
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Three groups of series, registered in this order (the exposition's): the
        # requests this frontend proxied, what each API key used, the daemon's engines.
        self._request_series(self.registry)
        self._key_series(self.registry)
        self._engine_series(self.registry)
        self._loads_seen: dict[str, int] = {}
        # The labelled children the request path uses, by label values: a
        # ``labels()`` lookup validates, joins and locks on every call, a dict
        # hit costs nothing (label values are bounded, so these stay small).
        self._done: dict[tuple[str, str, int], Any] = {}
        self._ttfb: dict[str, Any] = {}
        self._waited: dict[str, Any] = {}
        self._keyed: dict[tuple[str, str, str], Any] = {}

    def _request_series(self, r: CollectorRegistry) -> None:
        """The proxied requests: counts, waits, time to first byte, what failed."""
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
        self.phase_wait = Histogram(
            "ktd_frontend_wait_seconds",
            "Time a request waited before its answer began, by what it waited for "
            "(queued, room, pulling, loading, waking, prefill; ktd.core.waiting).",
            ["model", "phase"],
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
            "Times the daemon stopped answering the frontend (heartbeat or request unanswered).",
            registry=r,
        )

    def _key_series(self, r: CollectorRegistry) -> None:
        """Per API key, by the key's configured name (never its secret; NO_KEY without
        keys): what the usage ledger counts, as counters of this frontend's life."""
        self.key_requests, self.key_errors, self.key_tokens = (
            Counter(name, doc, labels, registry=r) for name, doc, labels in _KEY_SERIES
        )

    def _engine_series(self, r: CollectorRegistry) -> None:
        """The daemon's engines, from its last status (read just before a scrape)."""
        self.engines = EngineCollector()
        r.register(self.engines)
        self.load_seconds = Histogram(
            "ktd_engine_load_seconds",
            "Launch-to-ready time of engine loads (observed at scrape time from the "
            "daemon's counters; two loads between scrapes count the last one twice).",
            ["alias"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )

    def request_done(self, endpoint: str, model: str, status: int) -> None:
        """Count one finished request (``ktd_frontend_requests``)."""
        key = (endpoint, model, status)
        _child(self._done, key, self.requests, endpoint, model, str(status)).inc()

    def key_used(self, key: str, model: str, tokens: Tokens | None, *, error: bool) -> None:
        """Count one finished request of ``key`` (its name) on ``model``."""
        key = key or NO_KEY
        _child(self._keyed, (key, model, ""), self.key_requests, key, model).inc()
        if error:
            _child(self._keyed, (key, model, "e"), self.key_errors, key, model).inc()
        if tokens is not None:
            for kind, n in (("prompt", tokens.prompt), ("completion", tokens.completion)):
                labels = (key, model, kind)
                _child(self._keyed, labels, self.key_tokens, *labels).inc(n)

    def first_byte(self, model: str, seconds: float) -> None:
        _child(self._ttfb, model, self.ttfb, model).observe(seconds)

    def waited(self, model: str, seconds: float) -> None:
        _child(self._waited, model, self.load_wait, model).observe(seconds)

    def phase_waited(self, model: str, phase: str, seconds: float) -> None:
        self.phase_wait.labels(model, phase).observe(seconds)

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

    def add_budget(self, budget: Budget) -> None:
        """Export what the keys' requests hold of their ``tokens_per_day``, read at scrape."""
        self.registry.register(BudgetCollector(budget))

    def update_engines(self, engines: Sequence[Any]) -> None:
        """Feed the daemon's EngineInfo snapshot (taken just before a scrape)."""
        self.engines.snapshot = list(engines)
        for e in engines:
            seen = self._loads_seen.get(e.alias, 0)
            if e.loads > seen and e.load_seconds is not None:
                for _ in range(e.loads - seen):
                    self.load_seconds.labels(e.alias).observe(e.load_seconds)
            self._loads_seen[e.alias] = e.loads

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class BudgetCollector:
    """``ktd_key_tokens_held{key, where}``: tokens of each limited key's day that requests
    under way hold (``ktd.core.budget``): this frontend's (``here``) and, as the daemon
    last said, the other frontends' (``others``)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "ktd_key_tokens_held",
            "Tokens of a key's tokens_per_day held by its requests under way, by where.",
            labels=["key", "where"],
        )
        b = self.budget
        for key in sorted(b.limited | b.others.keys()):
            held.add_metric([key or NO_KEY, "here"], float(b.held(key)))
            held.add_metric([key or NO_KEY, "others"], float(b.others.get(key, 0)))
        yield held


ENGINE_STATES = tuple(S.ALL)


class EngineCollector:
    """ktd's per-engine gauges and counters, from the daemon's last status snapshot.

    A collector rather than Gauges: the values live in the daemon, and an engine
    removed by a reload must disappear from the exposition, not linger at its
    last value.
    """

    def __init__(self) -> None:
        self.snapshot: list[Any] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "ktd_engine_state", "1 for the engine's current state.", labels=["alias", "state"]
        )
        for e in self.snapshot:
            for name in ENGINE_STATES:
                state.add_metric([e.alias, name], 1.0 if e.state == name else 0.0)
        yield state
        rows = [((e.alias,), e) for e in self.snapshot]
        yield from promtable.collect(ENGINE_FAMILIES, ["alias"], rows)


#: ktd's per-engine series, read off each engine's ``EngineInfo``.
ENGINE_FAMILIES = (
    Family(
        "ktd_engine_in_flight",
        "Requests in flight on the engine: acquire leases plus claim holders' reports.",
        lambda e: e.in_flight,
    ),
    # The old name, for the dashboards and alerts that read it; removed in the next release.
    Family("ktd_engine_leases", "Deprecated: use ktd_engine_in_flight.", lambda e: e.in_flight),
    Family(
        "ktd_engine_queue_depth",
        "Requests waiting for the engine (a slot, a load or a swap).",
        lambda e: e.queued,
    ),
    Family(
        "ktd_engine_last_load_seconds",
        "Duration of the engine's last load.",
        lambda e: e.load_seconds,
    ),
    Family(
        "ktd_engine_restarts",
        "Automatic restarts after a crash.",
        lambda e: e.restarts,
        counter=True,
    ),
    Family(
        "ktd_engine_evictions",
        "Stops to make room for another engine.",
        lambda e: e.evictions,
        counter=True,
    ),
    Family("ktd_engine_loads", "Loads that reached ready.", lambda e: e.loads, counter=True),
    Family(
        "ktd_engine_load_seconds_spent",
        "Seconds spent in loads that reached ready.",
        lambda e: e.load_seconds_total,
        counter=True,
    ),
)


def _child(cache: dict[Any, Any], key: object, metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per ``key``."""
    child = cache.get(key)
    if child is None:
        child = cache[key] = metric.labels(*labels)
    return child
