"""The usage ledger: requests, tokens and errors per day, key and model, each counted once.

Why a machine of its own: frontends count what the engines report (``ktd.frontend.tally``)
and the daemon keeps the sum in its state directory, so the figures survive a restart of
either process and several frontends add up. The report travels with the frontend's
claim report (``Sync``), which may be lost, answered late, or sent twice (the long poll
and the report loop both send one); a count that rides it must be added exactly once.

So the frontend's ``Book`` numbers its batches: one batch is out at a time, resent
unchanged until the daemon acknowledges its number; what is counted meanwhile waits for
the next. The daemon's ``Ledger`` remembers, per frontend, the last batch it added, and
adds a batch only when its number is higher. The ledger and those numbers are written to
disk together before the daemon answers: a ``kill -9`` either loses the batch and its
number (the frontend sends it again) or keeps both (the resend is skipped).

Pure: days are ``YYYY-MM-DD`` strings (UTC) handed in by the caller, no clock read here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ktd import protocol as p

__all__ = ["Book", "Count", "Ledger", "Row", "day_number", "day_of", "days_before"]

#: A frontend not heard from for this many days is forgotten (its batch number too).
FORGET_CLIENT_DAYS = 7


def day_of(epoch_seconds: float) -> str:
    """The UTC day of a Unix time, as the ledger names it."""
    return dt.datetime.fromtimestamp(epoch_seconds, dt.UTC).strftime("%Y-%m-%d")


def days_before(day: str, days: int) -> str:
    """``day`` minus ``days`` days."""
    return (dt.date.fromisoformat(day) - dt.timedelta(days=days)).isoformat()


def day_number(day: str) -> int:
    """Days since the Unix epoch (the admission desk's count of a key's day)."""
    return (dt.date.fromisoformat(day) - _EPOCH).days


_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True, order=True)
class Row:
    """Where a count goes: a UTC day, a key's name ("" without keys) and a model."""

    day: str
    key: str
    model: str


@dataclass
class Count:
    requests: int = 0
    prompt: int = 0  # tokens, as the engine reported them
    completion: int = 0
    errors: int = 0  # requests answered with an error status (4xx but 499, 5xx)
    cut: int = 0  # requests whose client went away before the answer ended (499)

    def add(self, other: Count) -> None:
        self.requests += other.requests
        self.prompt += other.prompt
        self.completion += other.completion
        self.errors += other.errors
        self.cut += other.cut

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion


@dataclass
class Batch:
    seq: int
    rows: dict[Row, Count]


@dataclass
class Book:
    """A frontend's counts not yet in the ledger: the batch out (``sent``) and what came
    after (``pending``)."""

    max_rows: int = 10_000  # a batch's size limit (the protocol's bound on a report)
    pending: dict[Row, Count] = field(default_factory=dict)
    sent: Batch | None = None
    seq: int = 0

    def record(self, row: Row, count: Count) -> None:
        self.pending.setdefault(row, Count()).add(count)

    def batch(self) -> Batch | None:
        """The batch to report: the one out, until it is acknowledged; else a new one of
        what is pending (None: nothing to report)."""
        if self.sent is None and self.pending:
            self.seq += 1
            take = list(self.pending)[: self.max_rows]
            self.sent = Batch(self.seq, {row: self.pending.pop(row) for row in take})
        return self.sent

    def acked(self, seq: int) -> None:
        """The ledger holds every batch up to ``seq``."""
        if self.sent is not None and seq >= self.sent.seq:
            self.sent = None

    def unreported(self, day: str, *, sent: bool = True) -> dict[str, int]:
        """Tokens per key on ``day`` that the ledger does not hold yet (``sent`` False:
        those not in the batch out either)."""
        out: dict[str, int] = {}
        batch = self.sent.rows.items() if self.sent and sent else ()
        rows = [*self.pending.items(), *batch]
        for row, count in rows:
            if row.day == day:
                out[row.key] = out.get(row.key, 0) + count.tokens
        return out


@dataclass
class Seen:
    """The last batch the ledger added from one frontend, and the day it last reported."""

    seq: int
    day: str


@dataclass
class Ledger:
    """The daemon's sum of every frontend's counts (``Book`` has the why), by day: every
    frontend's report asks for today's tokens, which then reads one day's rows, not a
    year's."""

    days: dict[str, dict[Row, Count]] = field(default_factory=dict)
    clients: dict[str, Seen] = field(default_factory=dict)

    def merge(self, rows: Iterable[tuple[Row, Count]]) -> None:
        """Add ``rows`` to the sums (``add`` is the once-only way for a frontend's batch)."""
        for row, count in rows:
            self.days.setdefault(row.day, {}).setdefault(row, Count()).add(count)

    def add(self, client: str, seq: int, rows: Iterable[tuple[Row, Count]], today: str) -> bool:
        """Add ``client``'s batch ``seq`` unless it was added already; True if it was new
        (then the caller writes the ledger before it answers)."""
        seen = self.clients.get(client)
        if seen is not None and seq <= seen.seq:
            seen.day = today
            return False
        self.merge(rows)
        self.clients[client] = Seen(seq, today)
        return True

    def acked(self, client: str) -> int:
        """The last batch of ``client``'s that the ledger holds (0: none)."""
        seen = self.clients.get(client)
        return seen.seq if seen is not None else 0

    def spent(self, day: str) -> dict[str, int]:
        """Tokens per key on ``day``, every frontend's together."""
        out: dict[str, int] = {}
        for row, count in self.days.get(day, {}).items():
            out[row.key] = out.get(row.key, 0) + count.tokens
        return out

    def query(self, since: str = "", key: str | None = None) -> Iterator[tuple[Row, Count]]:
        """The rows from ``since`` (a day; "" all) of ``key`` (None: every key), in order."""
        for day in sorted(d for d in self.days if d >= since):
            rows = self.days[day]
            for row in sorted(rows):
                if key is None or row.key == key:
                    yield row, rows[row]

    def forget(self, today: str, keep_days: int) -> bool:
        """Drop rows older than ``keep_days`` and frontends long silent; True if any went."""
        oldest = days_before(today, keep_days)
        old_days = [day for day in self.days if day < oldest]
        quiet = days_before(today, FORGET_CLIENT_DAYS)
        old_clients = [c for c, seen in self.clients.items() if seen.day < quiet]
        for day in old_days:
            del self.days[day]
        for client in old_clients:
            del self.clients[client]
        return bool(old_days or old_clients)


def to_wire(row: Row, count: Count) -> p.UsageCount:
    return p.UsageCount(
        day=row.day,
        key=row.key,
        model=row.model,
        requests=count.requests,
        prompt=count.prompt,
        completion=count.completion,
        errors=count.errors,
        cut=count.cut,
    )


def from_wire(c: p.UsageCount) -> tuple[Row, Count]:
    return Row(c.day, c.key, c.model), Count(c.requests, c.prompt, c.completion, c.errors, c.cut)
