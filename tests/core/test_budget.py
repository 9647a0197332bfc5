"""A key's day of tokens: reserved at admission, settled at the end (``ktd.core.budget``).

Issue 43, item 4: twenty requests admitted at once against a day of 300 tokens were
served 400 to 1,020, because the day was checked only against what had ended. The
machine below checks, whatever arrives, ends, turns the day or comes from the ledger,
that what one frontend grants and what was spent never pass the limit by more than one
request's reservation.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ktd.core.budget import Budget, Crowded, Exhausted, Holds, Reservation
from tests.hypo import budget

DAY = 20_000


def test_concurrent_reservations_stop_at_the_limit() -> None:
    """The issue's numbers: 20 requests of 50 tokens at once, 300 a day: six go."""
    b = Budget()
    granted = []
    refused = 0
    for _ in range(20):
        try:
            granted.append(b.reserve("k", 300, 50, DAY))
        except Crowded as why:
            refused += 1
            assert "requests under way hold 300" in str(why)
    assert len(granted) == 6 and refused == 14
    assert b.held("k") == 300
    # One ends having used 20: its 50 go back, 20 are spent; 30 are free again.
    b.spent("k", DAY, 20)
    b.release(granted[0])
    assert b.held("k") == 250 and b.spent_today("k", DAY) == 20
    assert b.reserve("k", 300, 30, DAY).amount == 30
    with pytest.raises(Crowded):
        b.reserve("k", 300, 1, DAY)


def test_a_request_alone_may_finish_the_day_and_then_it_is_spent() -> None:
    b = Budget()
    b.spent("k", DAY, 280)
    lone = b.reserve("k", 300, 50, DAY)  # nothing else held: the one request past it
    with pytest.raises(Crowded):
        b.reserve("k", 300, 1, DAY)
    b.spent("k", DAY, 50)
    b.release(lone)
    with pytest.raises(Exhausted) as spent:
        b.reserve("k", 300, 1, DAY)
    assert spent.value.resets == DAY + 1 and "tokens_per_day" in str(spent.value)
    # More than a whole day, alone, on a new day: served rather than never.
    assert b.reserve("k", 300, 5000, DAY + 1).amount == 5000


def test_the_ledger_total_and_yesterday() -> None:
    b = Budget()
    b.spent("k", DAY, 90, total=True)  # the ledger's total across frontends
    b.spent("k", DAY, 40, total=True)  # a smaller total is older news
    assert b.spent_today("k", DAY) == 90
    b.spent("k", DAY - 1, 500)  # a late count of yesterday changes nothing today
    assert b.spent_today("k", DAY) == 90
    b.spent("k", DAY, 10)  # a request of this frontend's ended: added
    with pytest.raises(Exhausted):
        b.reserve("k", 100, 0, DAY)
    # A reservation made yesterday still holds today (its request is under way).
    old = b.reserve("j", 100, 60, DAY)
    with pytest.raises(Crowded):
        b.reserve("j", 100, 60, DAY + 1)
    b.release(old)
    b.release(old)  # idempotent
    assert b.held("j") == 0 and "j" not in b.keys


def test_a_key_without_a_limit_holds_nothing() -> None:
    b = Budget()
    r = b.reserve("free", None, 10**9, DAY)
    assert isinstance(r, Reservation) and r.amount == 0 and b.held("free") == 0
    b.release(r)


def test_what_other_frontends_hold_counts_and_their_report_says_it() -> None:
    """Two frontends, one key's day: each reports what its requests hold, the daemon
    (``Holds``) tells each the other's."""
    a, b, daemon = Budget(), Budget(), Holds()
    first = [a.reserve("k", 300, 70, DAY) for _ in range(4)]  # 280 held at a
    assert a.holding({"k": 5, "free": 9}) == {"k": 285}  # and 5 counted, not yet sent
    assert daemon.report("a", a.holding({}))
    assert not daemon.report("a", a.holding({}))  # the same again: nothing to tell
    b.others = daemon.others("b")
    assert b.others == {"k": 280} and daemon.others("a") == {}
    with pytest.raises(Crowded) as crowded:
        b.reserve("k", 300, 70, DAY)
    assert "hold 280" in str(crowded.value)
    assert b.reserve("k", 300, 20, DAY).amount == 20  # what is left of the day
    for r in first:
        a.release(r)
    assert daemon.report("a", a.holding({}))  # nothing held: a is out of the sum
    assert daemon.by_client == {} and daemon.others("b") == {}
    daemon.report("b", {"k": 20})
    assert daemon.forget(["b", "gone"]) and not daemon.forget(["b"])
    assert daemon.others("a") == {}


class BudgetMachine(RuleBasedStateMachine):
    """One frontend's budget: requests reserve, end having used at most what they
    reserved (the engine stops at ``max_tokens``), days turn, the ledger echoes what
    this frontend reported, the other frontends hold some of the day or none."""

    LIMIT = 300

    def __init__(self) -> None:
        super().__init__()
        self.budget = Budget()
        self.today = DAY
        self.out: dict[int, Reservation] = {}
        self.spent = 0  # today's tokens, as the model counts them
        self.biggest = 0  # the largest reservation granted today or still held

    @rule(amount=st.sampled_from([0, 1, 10, 50, 120, 299, 300, 301, 1000]))
    def reserve(self, amount: int) -> None:
        held = sum(r.amount for r in self.out.values()) + self.budget.others.get("k", 0)
        try:
            r = self.budget.reserve("k", self.LIMIT, amount, self.today)
        except Exhausted:
            assert self.spent >= self.LIMIT
            return
        except Crowded:
            assert held > 0 and self.spent + held + amount > self.LIMIT
            return
        # Granted: it fits, or nothing else is held and the day is not spent.
        assert self.spent + held + amount <= self.LIMIT or (held == 0 and self.spent < self.LIMIT)
        self.out[r.id] = r
        self.biggest = max(self.biggest, amount)

    @precondition(lambda self: bool(self.out))
    @rule(data=st.data(), share=st.sampled_from([0.0, 0.5, 1.0]))
    def ends(self, data: st.DataObject, share: float) -> None:
        rid = data.draw(st.sampled_from(sorted(self.out)))
        r = self.out.pop(rid)
        used = int(r.amount * share)
        self.budget.spent("k", self.today, used)
        self.spent += used
        self.budget.release(r)

    @rule()
    def ledger_echoes(self) -> None:
        """The ledger's total for the day: what this frontend reported (or less, late)."""
        self.budget.spent("k", self.today, self.spent, total=True)

    @rule(n=st.sampled_from([0, 0, 40, 250, 400]))
    def other_frontends_hold(self, n: int) -> None:
        """The daemon's word on what the other frontends' requests hold."""
        self.budget.others = {"k": n} if n else {}

    @rule()
    def day_turns(self) -> None:
        self.today += 1
        self.spent = 0
        self.biggest = max((r.amount for r in self.out.values()), default=0)

    @invariant()
    def never_past_the_limit_by_more_than_one_request(self) -> None:
        held = sum(r.amount for r in self.out.values())
        assert self.budget.held("k") == held
        assert self.budget.spent_today("k", self.today) == self.spent
        assert self.spent + held <= self.LIMIT + self.biggest


TestBudget = BudgetMachine.TestCase
TestBudget.settings = budget(200, stateful_step_count=50, deadline=None)
