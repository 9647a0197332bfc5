"""The dashboard's traffic history: per model, the last hour of rates, one point per sample.

Pure. The sampler (hub.py) reads cumulative counters every ``interval`` seconds: the
frontend's own (requests finished, time to first byte) and the engine's own from its
``/metrics`` (SGLang's generated tokens and time to first token). A point is the
difference between two readings over the time between them, so the plots cost
nothing per request: the counters exist for ``/metrics`` anyway. A counter that went
down was reset (an engine restarted): its new value is what happened since.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

WINDOW = 3600.0

# The SGLang series the dashboard reads from an engine's exposition.
GEN_TOKENS = "sglang:generation_tokens_total"
TTFT_SUM = "sglang:time_to_first_token_seconds_sum"
TTFT_COUNT = "sglang:time_to_first_token_seconds_count"
ENGINE_SERIES = (GEN_TOKENS, TTFT_SUM, TTFT_COUNT)


@dataclass(frozen=True)
class Totals:
    """One model's cumulative counters at one reading (None: the engine has no such series)."""

    requests: float = 0.0  # requests the frontend finished for it
    ttfb_sum: float = 0.0  # the frontend's time to first byte, summed
    ttfb_count: float = 0.0
    tokens: float | None = None  # the engine's generated tokens
    ttft_sum: float | None = None  # the engine's time to first token, summed
    ttft_count: float | None = None


@dataclass(frozen=True)
class Point:
    """Rates over one sample interval ending at ``t`` (wall clock)."""

    t: float
    rps: float  # requests finished per second
    tps: float | None  # tokens generated per second (the engine's count)
    ttft: float | None  # mean time to first byte at the frontend (s), None without requests
    engine_ttft: float | None  # the engine's own mean time to first token (s)

    def as_list(self) -> list[float | None]:
        """The compact wire form: ``[t, rps, tps, ttft, engine_ttft]``."""
        return [round(self.t, 3), _r(self.rps), _r(self.tps), _r(self.ttft), _r(self.engine_ttft)]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def increase(before: float | None, after: float | None) -> float | None:
    """How much a counter grew (None: not read both times); one that went down
    restarted from 0, so its value is the growth."""
    if after is None or before is None:
        return None
    if after < before:
        return after
    return after - before


def _mean(total: float | None, count: float | None) -> float | None:
    if total is None or not count:
        return None
    return total / count


def point(before: Totals, after: Totals, seconds: float, t: float) -> Point:
    """The rates between two readings ``seconds`` apart."""
    span = max(seconds, 1e-9)
    requests = increase(before.requests, after.requests) or 0.0
    tokens = increase(before.tokens, after.tokens)
    return Point(
        t=t,
        rps=requests / span,
        tps=None if tokens is None else tokens / span,
        ttft=_mean(
            increase(before.ttfb_sum, after.ttfb_sum),
            increase(before.ttfb_count, after.ttfb_count),
        ),
        engine_ttft=_mean(
            increase(before.ttft_sum, after.ttft_sum),
            increase(before.ttft_count, after.ttft_count),
        ),
    )


class SeriesBook:
    """Per model, a ring of the points of the last ``window`` seconds."""

    def __init__(self, interval: float, window: float = WINDOW) -> None:
        self.interval = interval
        self.size = max(1, int(window / interval))
        self.points: dict[str, deque[Point]] = {}
        self._last: dict[str, Totals] = {}
        self._last_t: float | None = None

    def add(self, t: float, totals: Mapping[str, Totals]) -> dict[str, Point]:
        """Record one reading at wall-clock ``t``; returns the new point of each model.

        The first reading of a model is its baseline (no point). A model missing
        from ``totals`` (removed by a reload) loses its history. An engine not read
        this time (a scrape that failed, an engine that stopped) keeps its last
        counters as the baseline of the next reading, so a missed scrape is a gap
        in the tokens line, never a spike.
        """
        new: dict[str, Point] = {}
        last_t = self._last_t
        kept: dict[str, Totals] = {}
        for alias, now in totals.items():
            before = self._last.get(alias)
            if before is not None and last_t is not None and t > last_t:
                p = point(before, now, t - last_t, t)
                ring = self.points.setdefault(alias, deque(maxlen=self.size))
                ring.append(p)
                new[alias] = p
            if before is not None and now.tokens is None and now.ttft_count is None:
                now = replace(
                    now,
                    tokens=before.tokens,
                    ttft_sum=before.ttft_sum,
                    ttft_count=before.ttft_count,
                )
            kept[alias] = now
        for gone in set(self._last) - set(totals):
            self.points.pop(gone, None)
        self._last = kept
        self._last_t = t
        return new

    def latest(self) -> dict[str, Point]:
        return {alias: ring[-1] for alias, ring in self.points.items() if ring}

    def as_wire(self) -> dict[str, list[list[float | None]]]:
        return {alias: [p.as_list() for p in ring] for alias, ring in self.points.items()}


# ---------------------------------------------------------------- reading counters

Sample = tuple[str, Mapping[str, str], float]  # (sample name, labels, value)


def frontend_totals(
    samples: Iterable[Sample], aliases: Iterable[str]
) -> dict[str, dict[str, float]]:
    """Requests and time-to-first-byte sums per model from the frontend's own metrics."""
    out: dict[str, dict[str, float]] = {a: {} for a in aliases}
    for name, labels, value in samples:
        fields = out.get(labels.get("model", ""))
        if fields is None:
            continue  # placeholders (_none, _unknown) and names nobody configured
        if name == "ktd_frontend_requests_total":
            fields["requests"] = fields.get("requests", 0.0) + value
        elif name == "ktd_frontend_time_to_first_byte_seconds_sum":
            fields["ttfb_sum"] = fields.get("ttfb_sum", 0.0) + value
        elif name == "ktd_frontend_time_to_first_byte_seconds_count":
            fields["ttfb_count"] = fields.get("ttfb_count", 0.0) + value
    return out


def exposition_sums(text: str, names: Iterable[str] = ENGINE_SERIES) -> dict[str, float]:
    """Each wanted series of a Prometheus text exposition, summed over its label sets."""
    wanted = set(names)
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value == value:  # NaN counts as nothing
            out[name] = out.get(name, 0.0) + value
    return out


def totals_of(frontend: Mapping[str, float], engine: Mapping[str, float] | None) -> Totals:
    """One model's reading from its frontend fields and (when scraped) its engine's sums."""
    eng = engine or {}
    return Totals(
        requests=frontend.get("requests", 0.0),
        ttfb_sum=frontend.get("ttfb_sum", 0.0),
        ttfb_count=frontend.get("ttfb_count", 0.0),
        tokens=eng.get(GEN_TOKENS),
        ttft_sum=eng.get(TTFT_SUM),
        ttft_count=eng.get(TTFT_COUNT),
    )
