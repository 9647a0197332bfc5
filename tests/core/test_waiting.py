"""The board of waiting requests: phases, positions and ETAs (``ktd.core.waiting``)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from ktd.core import states as S
from ktd.core.waiting import Board, EngineLook, Progress, Rates, Waiter, WaitPhase, decide
from tests.hypo import budget


def one(board: Board, rid: int, look: EngineLook | None, now: float) -> Progress:
    found = board.progress(rid, look, now)
    assert found is not None
    return found


def test_positions_follow_arrival_and_close_up_when_one_leaves() -> None:
    b = Board()
    for rid in (1, 2, 3, 4):
        b.arrive(rid, "m", float(rid))
    b.arrive(9, "other", 0.0)
    assert [b.position(r) for r in (1, 2, 3, 4, 9)] == [1, 2, 3, 4, 1]
    b.leave(2)  # hung up
    assert [b.position(r) for r in (1, 3, 4)] == [1, 2, 3]
    b.sent(1, 10.0)  # its slot came: prefill, out of the line
    assert [b.position(r) for r in (1, 3, 4)] == [0, 1, 2]
    assert one(b, 1, None, 11.0).phase == WaitPhase.PREFILL
    b.first_token(1, 11.5)
    assert b.progress(1, None, 12.0) is None
    assert b.oldest(20.0) == {"m": 17.0, "other": 20.0}


def test_a_request_that_asks_again_keeps_its_age_and_goes_to_the_end() -> None:
    b = Board()
    b.arrive(1, "m", 0.0)
    b.arrive(2, "m", 1.0)
    b.arrive(1, "m", 5.0)  # a stale claim: it asks anew
    assert (b.position(2), b.position(1)) == (1, 2)
    assert one(b, 1, None, 6.0).waited == 6.0


def test_phases_from_the_engines_state() -> None:
    w = Waiter(1, "m", since=0.0)
    r = Rates()

    def phase(look: EngineLook | None) -> WaitPhase:
        return decide(w, 1, 1, look, r, 1.0).phase

    assert phase(None) == WaitPhase.QUEUED  # not known yet: its place in the line
    assert phase(EngineLook(S.READY)) == WaitPhase.QUEUED
    assert phase(EngineLook(S.ASLEEP)) == WaitPhase.WAKING
    assert phase(EngineLook(S.WAKING, step="resuming")) == WaitPhase.WAKING
    assert phase(EngineLook(S.STARTING, step="loading")) == WaitPhase.LOADING
    assert phase(EngineLook(S.STOPPED)) == WaitPhase.LOADING  # the claim loads it
    assert phase(EngineLook(S.STARTING, step="pulling")) == WaitPhase.PULLING
    room = decide(w, 1, 1, EngineLook(S.STARTING, step="waiting", waiting_for=("a",)), r, 1.0)
    assert (room.phase, room.waiting_for) == (WaitPhase.ROOM, ("a",))
    assert "a to go idle" in room.text()
    waking_room = EngineLook(S.WAKING, step="making_room", waiting_for=("b",))
    assert phase(waking_room) == WaitPhase.ROOM


def test_the_load_eta_is_the_history_less_its_age_else_from_the_percentage() -> None:
    w = Waiter(1, "m", since=0.0)
    r = Rates()
    look = EngineLook(S.STARTING, step="loading", elapsed=30.0, load_eta=100.0, percent=50.0)
    got = decide(w, 1, 1, look, r, 1.0)
    assert (got.phase, got.eta, got.percent) == (WaitPhase.LOADING, 70.0, 50.0)
    no_history = EngineLook(S.STARTING, step="loading", elapsed=30.0, percent=25.0)
    assert decide(w, 1, 1, no_history, r, 1.0).eta == 90.0
    assert decide(w, 1, 1, EngineLook(S.STARTING, elapsed=30.0), r, 1.0).eta is None
    overdue = EngineLook(S.STARTING, elapsed=130.0, load_eta=100.0)
    assert decide(w, 1, 1, overdue, r, 1.0).eta == 0.0
    # Not started yet (stopped): a whole load.
    assert decide(w, 1, 1, EngineLook(S.STOPPED, load_eta=100.0), r, 1.0).eta == 100.0


def test_the_queue_eta_counts_slots_and_the_measured_service_time() -> None:
    r = Rates()
    w = Waiter(1, "m", since=0.0)
    full = EngineLook(S.READY, in_flight=2, max_concurrent=2)
    assert decide(w, 3, 3, full, r, 1.0).eta is None  # nothing measured yet
    r.served(4.0)
    # Third in line, both slots busy: three slots must free up, two per 4 s.
    assert decide(w, 3, 3, full, r, 1.0).eta == 6.0
    free = EngineLook(S.READY, in_flight=1, max_concurrent=2)
    assert decide(w, 1, 1, free, r, 1.0).eta == 0.0
    assert decide(w, 5, 5, EngineLook(S.READY), r, 1.0).eta == 0.0  # no limit
    r.served(8.0)
    assert r.service == 0.7 * 4.0 + 0.3 * 8.0


def test_a_wake_is_timed_from_the_first_look_and_makes_the_next_eta() -> None:
    b = Board()
    b.arrive(1, "m", 0.0)
    b.saw("m", EngineLook(S.ASLEEP), 1.0)
    b.saw("m", EngineLook(S.WAKING, elapsed=0.5), 1.6)  # the first look stands
    assert one(b, 1, EngineLook(S.WAKING), 2.0).eta is None  # no wake seen yet
    b.sent(1, 4.0)  # woke: 3 s
    b.first_token(1, 4.2)
    assert b.rates_of("m").wake() == 3.0
    assert b.rates_of("m").first_token is not None
    b.arrive(2, "m", 10.0)
    b.saw("m", EngineLook(S.WAKING, elapsed=1.0), 10.0)
    assert one(b, 2, EngineLook(S.WAKING), 11.0).eta == 1.0  # 3 s, 2 of them gone


def test_prefill_eta_from_the_time_to_first_token() -> None:
    b = Board()
    b.rates_of("m").first(2.0)
    b.arrive(1, "m", 0.0)
    b.sent(1, 1.0)
    got = one(b, 1, EngineLook(S.READY), 1.5)
    assert (got.phase, got.position, got.eta) == (WaitPhase.PREFILL, 0, 1.5)


def test_the_progress_document_and_its_text() -> None:
    p = Progress(WaitPhase.LOADING, "m\n", 2, 3, 4.25, eta=9.01, detail="loading weights",
                 percent=50.4)  # fmt: skip
    assert p.doc() == {
        "phase": "loading",
        "model": "m\n",
        "position": 2,
        "ahead": 1,
        "queued": 3,
        "waited": 4.2,
        "eta": 9.0,
        "detail": "loading weights",
        "percent": 50,
    }
    assert p.text() == "loading m (loading weights), 50%, 4s so far, ~10s to go"
    q = Progress(WaitPhase.QUEUED, "m", 3, 3, 1.0)
    assert q.text() == "queued for m: 2 request(s) ahead, 1s so far"
    assert q.key() != Progress(WaitPhase.QUEUED, "m", 2, 3, 1.0).key()
    assert q.key() == Progress(WaitPhase.QUEUED, "m", 3, 9, 1.0).key()  # arrivals behind it
    assert q.key() == Progress(WaitPhase.QUEUED, "m", 3, 3, 9.0).key()  # time alone: no news


class BoardMachine(RuleBasedStateMachine):
    """Any arrivals, hang-ups, grants and first tokens: in each model's line the
    positions are 1..N in arrival order, and one that leaves moves up exactly those
    behind it, by one."""

    rids = Bundle("rids")

    def __init__(self) -> None:
        super().__init__()
        self.board = Board()
        self.now = 0.0
        self.next = 0
        self.order: dict[str, list[int]] = {}  # the model's line, as the test keeps it

    def _positions(self) -> dict[int, int]:
        return {rid: self.board.position(rid) for rids in self.order.values() for rid in rids}

    @rule(target=rids, model=st.sampled_from(["a", "b"]))
    def arrive(self, model: str) -> int:
        self.next += 1
        self.now += 1.0
        self.board.arrive(self.next, model, self.now)
        self.order.setdefault(model, []).append(self.next)
        return self.next

    def _out(self, rid: int, action: str) -> None:
        before = self._positions()
        line = next((r for r in self.order.values() if rid in r), None)
        if action == "leave":
            self.board.leave(rid)
        elif action == "sent":
            self.board.sent(rid, self.now)
        else:
            self.board.first_token(rid, self.now)
        if line is None:  # not in a line (sent, or gone): nobody moves
            assert self._positions() == before
            return
        at = line.index(rid)
        line.remove(rid)
        after = self._positions()
        for i, other in enumerate(line):
            assert after[other] == before[other] - (1 if i >= at else 0)

    @rule(rid=rids, action=st.sampled_from(["leave", "sent", "first_token"]))
    def go(self, rid: int, action: str) -> None:
        self.now += 0.5
        self._out(rid, action)

    @invariant()
    def positions_are_one_to_n_in_arrival_order(self) -> None:
        for model, line in self.order.items():
            assert [self.board.position(r) for r in line] == list(range(1, len(line) + 1))
            assert self.board.line(model) == line
            for rid in line:
                found = self.board.progress(rid, None, self.now)
                assert found is not None and found.queued == len(line)
                assert found.ahead == found.position - 1

    @invariant()
    def oldest_is_the_head_of_each_line(self) -> None:
        oldest = self.board.oldest(self.now)
        assert set(oldest) == {m for m, line in self.order.items() if line}
        for model, line in self.order.items():
            if line:
                assert oldest[model] == self.now - self.board.waiters[line[0]].since


TestBoard = BoardMachine.TestCase
TestBoard.settings = budget(200, stateful_step_count=30, deadline=None)
