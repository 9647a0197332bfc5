"""The dashboard's traffic history, pure: counters in, rates out."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ktd.frontend.ui.series import (
    GEN_TOKENS,
    TTFT_COUNT,
    TTFT_SUM,
    SeriesBook,
    Totals,
    exposition_sums,
    frontend_totals,
    increase,
    point,
    totals_of,
)


def test_increase_handles_resets_and_missing_readings() -> None:
    assert increase(10, 15) == 5
    assert increase(10, 3) == 3  # restarted from 0: what it counted since
    assert increase(None, 3) is None  # no baseline: unknown, never a spike
    assert increase(3, None) is None


def test_point_rates_over_the_interval() -> None:
    before = Totals(requests=10, ttfb_sum=1.0, ttfb_count=4, tokens=100, ttft_sum=0.5, ttft_count=2)
    after = Totals(requests=30, ttfb_sum=3.0, ttfb_count=8, tokens=600, ttft_sum=1.5, ttft_count=6)
    p = point(before, after, 10.0, t=1234.0)
    assert p.t == 1234.0
    assert p.rps == 2.0 and p.tps == 50.0
    assert p.ttft == 0.5 and p.engine_ttft == 0.25
    idle = point(after, after, 10.0, t=1244.0)
    assert idle.rps == 0.0 and idle.tps == 0.0
    assert idle.ttft is None and idle.engine_ttft is None  # no request: no mean, not zero
    assert point(Totals(), Totals(), 10.0, t=1.0).tps is None  # no engine series at all


def test_book_baseline_ring_and_removed_models() -> None:
    book = SeriesBook(interval=10.0, window=30.0)
    assert book.size == 3
    assert book.add(0.0, {"a": Totals(requests=0), "b": Totals()}) == {}  # baseline
    for i in range(1, 6):
        new = book.add(10.0 * i, {"a": Totals(requests=5.0 * i), "b": Totals()})
        assert new["a"].rps == 0.5
    assert [p.t for p in book.points["a"]] == [30.0, 40.0, 50.0]  # only the window kept
    book.add(60.0, {"a": Totals(requests=30)})
    assert "b" not in book.points  # removed by a reload: its history goes
    assert set(book.latest()) == {"a"}
    wire = book.as_wire()["a"][-1]
    assert wire == [60.0, 0.5, None, None, None]


def test_a_missed_scrape_is_a_gap_not_a_spike() -> None:
    book = SeriesBook(interval=10.0)
    book.add(0.0, {"a": Totals(tokens=1000.0)})
    gap = book.add(10.0, {"a": Totals(tokens=None)})  # the scrape failed
    assert gap["a"].tps is None
    back = book.add(20.0, {"a": Totals(tokens=1100.0)})
    assert back["a"].tps == 10.0  # measured against the last real reading


def test_an_engine_first_seen_later_starts_without_a_spike() -> None:
    book = SeriesBook(interval=10.0)
    book.add(0.0, {"a": Totals(tokens=None)})
    first = book.add(10.0, {"a": Totals(tokens=5_000_000.0)})
    assert first["a"].tps is None


counters = st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=2)


@given(counters)
def test_rates_are_never_negative_whatever_the_counters_do(values: list[float]) -> None:
    book = SeriesBook(interval=1.0)
    for i, v in enumerate(values):
        for p in book.add(float(i), {"a": Totals(requests=v, tokens=v)}).values():
            assert p.rps >= 0 and (p.tps is None or p.tps >= 0)
            assert math.isfinite(p.rps)


SGLANG = """# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="my model"} 7.557572e+06
sglang:generation_tokens_total{model_name="other"} 10
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.5
sglang:time_to_first_token_seconds_count{model_name="m"} 4.0
sglang:time_to_first_token_seconds_count NaN
sglang:generation_tokens_totalx 99
garbage line
"""


def test_exposition_sums() -> None:
    got = exposition_sums(SGLANG)
    assert got == {GEN_TOKENS: 7557582.0, TTFT_SUM: 2.5, TTFT_COUNT: 4.0}
    assert exposition_sums("") == {}


def test_frontend_totals_keep_configured_models_only() -> None:
    samples = [
        ("ktd_frontend_requests_total", {"model": "a", "status": "200"}, 3.0),
        ("ktd_frontend_requests_total", {"model": "a", "status": "500"}, 1.0),
        ("ktd_frontend_requests_created", {"model": "a"}, 1e9),
        ("ktd_frontend_requests_total", {"model": "_none"}, 7.0),
        ("ktd_frontend_time_to_first_byte_seconds_sum", {"model": "a"}, 0.4),
        ("ktd_frontend_time_to_first_byte_seconds_count", {"model": "a"}, 2.0),
        ("ktd_frontend_time_to_first_byte_seconds_bucket", {"model": "a", "le": "1"}, 2.0),
    ]
    got = frontend_totals(samples, ["a", "b"])
    assert got == {"a": {"requests": 4.0, "ttfb_sum": 0.4, "ttfb_count": 2.0}, "b": {}}
    t = totals_of(got["a"], {GEN_TOKENS: 9.0})
    assert t == Totals(requests=4.0, ttfb_sum=0.4, ttfb_count=2.0, tokens=9.0)
    assert totals_of(got["b"], None) == Totals()
