"""Prometheus families read off a status snapshot, declared as one table per collector.

Why: ktd's per-engine and per-router series are not kept in the frontend; they
are read at scrape time from the daemon's last status reply. Each series is a
name, a help text, whether it is a counter and how to read its value off one row
of the snapshot: a row of :class:`Family`, not a block of hand-written
``GaugeMetricFamily`` calls per collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(frozen=True)
class Family:
    """One series family: ``value(row)`` is its sample for a row (None: no sample)."""

    name: str
    help: str
    value: Callable[[Any], float | int | bool | None]
    counter: bool = False


def collect(
    table: Sequence[Family], labels: Sequence[str], rows: Iterable[tuple[Sequence[str], Any]]
) -> list[Metric]:
    """The table's families over ``rows`` (label values, row): every family is
    exposed, even without samples, so ``# HELP`` and ``# TYPE`` are stable."""
    built: list[GaugeMetricFamily | CounterMetricFamily] = [
        (CounterMetricFamily if f.counter else GaugeMetricFamily)(f.name, f.help, labels=labels)
        for f in table
    ]
    for values, row in rows:
        for spec, metric in zip(table, built, strict=True):
            value = spec.value(row)
            if value is not None:
                metric.add_metric(list(values), float(value))
    return list(built)
