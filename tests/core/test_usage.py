"""The usage ledger's rule: every count a frontend reports is added exactly once, whatever
the channel does to its reports (lost, answered late, sent twice) and whichever process
restarts."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ktd.core.usage import Book, Count, Ledger, Row, day_number, day_of, days_before
from tests.hypo import budget

DAY = "2026-12-04"


def one(tokens: int = 10, *, error: bool = False) -> Count:
    return Count(requests=1, prompt=tokens // 2, completion=tokens - tokens // 2, errors=int(error))


def test_days_are_utc_and_count_from_the_epoch() -> None:
    assert day_of(0) == "1970-01-01"
    assert day_of(86400 * 20_000 + 86399.9) == "2024-10-04"
    assert day_number("1970-01-02") == 1 and day_number(day_of(86400 * 20_000)) == 20_000
    assert days_before("2026-03-01", 1) == "2026-02-28"


def test_a_batch_is_resent_unchanged_until_acknowledged_and_added_once() -> None:
    book, ledger = Book(), Ledger()
    book.record(Row(DAY, "alice", "m1"), one(10))
    first = book.batch()
    assert first is not None and first.seq == 1
    book.record(Row(DAY, "alice", "m1"), one(4))  # after the batch went: the next one
    assert book.batch() is first
    assert ledger.add("fe", first.seq, first.rows.items(), DAY)
    assert not ledger.add("fe", first.seq, first.rows.items(), DAY)  # the resend
    assert ledger.spent(DAY) == {"alice": 10}
    assert book.unreported(DAY) == {"alice": 14}  # not acknowledged yet: still ours
    book.acked(ledger.acked("fe"))
    assert book.unreported(DAY) == {"alice": 4}
    second = book.batch()
    assert second is not None and second.seq == 2
    assert ledger.add("fe", 2, second.rows.items(), DAY)
    assert ledger.spent(DAY) == {"alice": 14}


def test_counts_add_up_per_day_key_and_model_and_errors_are_counted() -> None:
    ledger = Ledger()
    rows = [
        (Row(DAY, "alice", "m1"), one(10)),
        (Row(DAY, "bob", "m1"), one(3, error=True)),
        (Row("2026-12-03", "alice", "m2"), one(7)),
    ]
    ledger.add("fe1", 1, rows, DAY)
    ledger.add("fe2", 1, [(Row(DAY, "alice", "m1"), one(5))], DAY)  # another frontend
    got = {row: count for row, count in ledger.query()}
    assert got[Row(DAY, "alice", "m1")] == Count(2, 7, 8, 0)
    assert got[Row(DAY, "bob", "m1")].errors == 1
    assert [r.day for r, _ in ledger.query(since=DAY)] == [DAY, DAY]
    assert [r.key for r, _ in ledger.query(key="bob")] == ["bob"]
    assert ledger.spent("2026-12-03") == {"alice": 7}


def test_old_rows_and_long_silent_frontends_are_forgotten() -> None:
    ledger = Ledger()
    ledger.add("old", 1, [(Row("2025-01-01", "", "m"), one())], "2025-01-01")
    ledger.add("new", 1, [(Row(DAY, "", "m"), one())], DAY)
    assert ledger.forget(DAY, keep_days=366)
    assert [r.day for r, _ in ledger.query()] == [DAY]
    assert set(ledger.clients) == {"new"}
    assert not ledger.forget(DAY, keep_days=366)


def test_a_batch_is_no_larger_than_a_report_may_be() -> None:
    book = Book(max_rows=2)
    for model in ("a", "b", "c"):
        book.record(Row(DAY, "", model), one())
    first = book.batch()
    assert first is not None and len(first.rows) == 2
    book.acked(first.seq)
    second = book.batch()
    assert second is not None and list(second.rows) == [Row(DAY, "", "c")]


KEYS = ("", "alice", "bob")


def totals(counts: object) -> tuple[int, int]:
    """(requests, tokens) of an iterable of Counts."""
    items = list(counts)  # type: ignore[call-overload]
    return sum(c.requests for c in items), sum(c.tokens for c in items)


def owed(book: Book, held: int) -> tuple[int, int]:
    """What ``book`` counted that a ledger holding its batches up to ``held`` lacks."""
    counts = list(book.pending.values())
    if book.sent is not None and held < book.sent.seq:
        counts += book.sent.rows.values()
    return totals(counts)


class Channel(RuleBasedStateMachine):
    """Two frontends, one ledger, and a channel that loses, delays and repeats reports.

    A report is taken when sent (``Book.batch``); it may arrive or not; its reply (the
    acknowledgement) may come back or not; an old report may arrive again later. The
    daemon may restart (its ledger as written) and a frontend may stop cleanly (it hands
    in what it has, as ``ClaimBroker.aclose`` does) or be killed (what it had not sent is
    gone; a report it sent may still arrive). Every count is in the ledger once, or still
    with the frontend that counted it."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.books = {"fe1": Book(max_rows=2), "fe2": Book(max_rows=2)}
        self.lives = {"fe1": 0, "fe2": 0}
        self.recorded = (0, 0)  # (requests, tokens) every frontend counted
        self.killed: list[tuple[str, Book]] = []  # a report of theirs may still arrive
        self.in_air: list[tuple[str, int, list[tuple[Row, Count]]]] = []

    def client(self, name: str) -> str:
        return f"{name}-{self.lives[name]}"

    @rule(
        name=st.sampled_from(["fe1", "fe2"]),
        key=st.sampled_from(KEYS),
        tokens=st.integers(0, 50),
        error=st.booleans(),
    )
    def request_ends(self, name: str, key: str, tokens: int, error: bool) -> None:
        self.books[name].record(Row(DAY, key, "m"), one(tokens, error=error))
        self.recorded = (self.recorded[0] + 1, self.recorded[1] + tokens)

    @rule(name=st.sampled_from(["fe1", "fe2"]), arrives=st.booleans(), answered=st.booleans())
    def report(self, name: str, arrives: bool, answered: bool) -> None:
        book = self.books[name]
        batch = book.batch()
        if batch is None:
            return
        sent = (self.client(name), batch.seq, list(copy.deepcopy(batch.rows).items()))
        self.in_air.append(sent)
        if arrives:
            self.ledger.add(*sent, DAY)
            if answered:
                book.acked(self.ledger.acked(self.client(name)))

    @rule(name=st.sampled_from(["fe1", "fe2"]))
    def a_reply_comes_back(self, name: str) -> None:
        """Any reply (a parked poll's, one to a report without a batch) says what the
        ledger holds of this frontend's, whenever it comes."""
        self.books[name].acked(self.ledger.acked(self.client(name)))

    @precondition(lambda self: bool(self.in_air))
    @rule(which=st.integers(0, 100))
    def an_old_report_arrives_again(self, which: int) -> None:
        self.ledger.add(*self.in_air[which % len(self.in_air)], DAY)

    @rule()
    def the_daemon_restarts(self) -> None:
        self.ledger = copy.deepcopy(self.ledger)  # what it wrote before any reply

    @rule(name=st.sampled_from(["fe1", "fe2"]))
    def a_frontend_stops_cleanly(self, name: str) -> None:
        book = self.books[name]
        while (batch := book.batch()) is not None:
            self.ledger.add(self.client(name), batch.seq, batch.rows.items(), DAY)
            book.acked(self.ledger.acked(self.client(name)))
        self.books[name] = Book(max_rows=2)
        self.lives[name] += 1

    @rule(name=st.sampled_from(["fe1", "fe2"]))
    def a_frontend_is_killed(self, name: str) -> None:
        self.killed.append((self.client(name), self.books[name]))
        self.books[name] = Book(max_rows=2)
        self.lives[name] += 1

    @invariant()
    def every_count_is_in_the_ledger_once_or_still_with_its_frontend(self) -> None:
        held = totals(c for _, c in self.ledger.query())
        books = [(self.client(n), b) for n, b in self.books.items()] + self.killed
        elsewhere = [owed(book, self.ledger.acked(client)) for client, book in books]
        requests = held[0] + sum(w[0] for w in elsewhere)
        tokens = held[1] + sum(w[1] for w in elsewhere)
        assert (requests, tokens) == self.recorded

    @invariant()
    def a_frontend_s_unreported_tokens_are_what_the_ledger_lacks(self) -> None:
        for name, book in self.books.items():
            if book.sent is None or self.ledger.acked(self.client(name)) < book.sent.seq:
                assert sum(book.unreported(DAY).values()) == owed(book, 0)[1]


Channel.TestCase.settings = budget(150, stateful_step_count=40, deadline=None)
TestChannel = Channel.TestCase
