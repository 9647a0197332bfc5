"""The snapshot table: one row of :class:`Family` per series, exposed as Prometheus text."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from ktd.frontend import promtable
from ktd.frontend.promtable import Family

TABLE = (
    Family("t_up", "Up or not.", lambda r: r.up),
    Family("t_sent", "Sent.", lambda r: r.sent, counter=True),
    Family("t_last", "Last, when known.", lambda r: r.last),
)


class _Rows:
    def __init__(self, rows: list[tuple[tuple[str, ...], object]]) -> None:
        self.rows = rows

    def collect(self) -> list[Metric]:
        return promtable.collect(TABLE, ["who"], self.rows)


def _text(rows: list[tuple[tuple[str, ...], object]]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Rows(rows))
    return generate_latest(registry).decode()


def test_each_row_gives_one_sample_per_family_and_none_gives_none() -> None:
    text = _text(
        [
            (("a",), SimpleNamespace(up=True, sent=3, last=1.5)),
            (("b",), SimpleNamespace(up=False, sent=0, last=None)),
        ]
    )
    assert 't_up{who="a"} 1.0' in text
    assert 't_up{who="b"} 0.0' in text
    assert "# TYPE t_sent_total counter" in text
    assert 't_sent_total{who="a"} 3.0' in text
    assert 't_last{who="a"} 1.5' in text
    assert 't_last{who="b"}' not in text


def test_families_are_described_without_rows() -> None:
    text = _text([])
    for name in ("t_up", "t_sent_total", "t_last"):
        assert f"# HELP {name} " in text
