"""Admission (``ktd.core.admission``): the limits' one meaning, the daemon's gate, the
frontend's desk; unit tests, then a hypothesis state machine for each."""

from __future__ import annotations

import math

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from ktd.core import admission as adm
from ktd.core import states as S
from ktd.core.admission import EngineView, Gate, GateWaiter, QueueLimits, WaitEnd
from tests.hypo import budget

# ---------------------------------------------------------------- limits


def test_max_queue_counts_only_requests_behind_others() -> None:
    one = QueueLimits(max_concurrent=1, max_queue=0)
    assert one.may_join(in_flight=0, waiting=0)  # it will have the slot: no queue
    assert not one.may_join(in_flight=1, waiting=0)  # it would wait behind a request
    assert not one.may_join(in_flight=0, waiting=1)
    two = QueueLimits(max_concurrent=2, max_queue=1)
    assert two.may_join(in_flight=1, waiting=1)  # one for the free slot, one queued
    assert not two.may_join(in_flight=1, waiting=2)


def test_without_max_concurrent_nobody_is_ever_queued() -> None:
    """No slot to wait for: requests only wait for a load or swap, however many."""
    lim = QueueLimits(max_queue=0)
    assert lim.may_join(in_flight=5, waiting=1000)
    assert QueueLimits().may_join(in_flight=10**6, waiting=10**6)
    assert QueueLimits(max_concurrent=3).free(1) == 2 and math.isinf(QueueLimits().free(7))


# ---------------------------------------------------------------- the gate


def ready(in_flight: int = 0, **kw: object) -> EngineView:
    return EngineView(state=S.READY, want_up=True, in_flight=in_flight, **kw)  # type: ignore[arg-type]


def outcomes(actions: list[adm.GateAction]) -> list[tuple[int, WaitEnd] | str]:
    return [(a.ticket, a.outcome) if isinstance(a, adm.Answer) else "launch" for a in actions]


def test_a_ready_engine_with_room_grants_at_once() -> None:
    g = Gate()
    assert g.may_pass(claim=False, view=ready(), limits=QueueLimits(max_concurrent=1))
    assert not g.may_pass(claim=False, view=ready(1), limits=QueueLimits(max_concurrent=1))
    assert g.may_pass(
        claim=True, view=ready(1), limits=QueueLimits(max_concurrent=1)
    )  # claims count
    acts = g.arrive(GateWaiter(1), ready(), QueueLimits(), now=0)
    assert outcomes(acts) == [(1, WaitEnd.GRANTED)] and not g.line


def test_leases_wait_in_arrival_order_for_slots_and_claims_do_not_overtake() -> None:
    g, lim = Gate(), QueueLimits(max_concurrent=1)
    assert g.arrive(GateWaiter(1), ready(1), lim, now=0) == []
    assert g.arrive(GateWaiter(2, claim=True), ready(1), lim, now=0) == []  # behind the lease
    assert g.update(ready(1), lim, now=1) == []
    assert outcomes(g.update(ready(0), lim, now=2)) == [(1, WaitEnd.GRANTED), (2, WaitEnd.GRANTED)]


def test_a_cold_engine_is_launched_once_and_its_end_answers_every_rider() -> None:
    g = Gate()
    stopped = EngineView(state=S.STOPPED, want_up=False)
    assert outcomes(g.arrive(GateWaiter(1), stopped, QueueLimits(), now=0)) == ["launch"]
    starting = EngineView(state=S.STARTING, want_up=True)
    assert g.arrive(GateWaiter(2), starting, QueueLimits(), now=0) == []
    failed = EngineView(state=S.FAILED, want_up=False, retry_in=30)
    assert outcomes(g.update(failed, QueueLimits(), now=5)) == [
        (1, WaitEnd.ATTEMPT_ENDED),
        (2, WaitEnd.ATTEMPT_ENDED),
    ]
    # A request after the failure, inside the backoff: told to retry later, nothing launched.
    assert outcomes(g.arrive(GateWaiter(3), failed, QueueLimits(), now=6)) == [
        (3, WaitEnd.RETRY_LATER)
    ]


def test_requests_that_waited_through_an_evict_bring_the_engine_back_with_one_load() -> None:
    g, lim = Gate(), QueueLimits(max_concurrent=1)
    g.arrive(GateWaiter(1), ready(1), lim, now=0)
    g.arrive(GateWaiter(2), ready(1), lim, now=0)
    draining = EngineView(state=S.DRAINING, want_up=False, in_flight=1)
    assert g.update(draining, lim, now=1) == []
    stopped = EngineView(state=S.STOPPED, want_up=False)
    assert outcomes(g.update(stopped, lim, now=2)) == ["launch"]  # one load for both
    assert all(w.riding for w in g.line)


def test_requests_waiting_for_a_load_ride_through_a_reloads_restart() -> None:
    """Issue 31: a reload that changed a loading model failed the requests waiting for
    it, although the restarted engine came up a moment later. The restart's stop is
    not the load's end: they ride the new load; an evict during the restart ends it."""
    g = Gate()
    starting = EngineView(state=S.STARTING, want_up=True)
    g.arrive(GateWaiter(1), starting, QueueLimits(), now=0)
    for state in (S.STOPPING, S.STOPPED):
        restart = EngineView(state=state, want_up=False, restarting=True)
        assert g.update(restart, QueueLimits(), now=1) == []
    assert g.arrive(GateWaiter(2), restart, QueueLimits(), now=1) == []  # a late one rides too
    assert all(w.riding for w in g.line)
    assert outcomes(g.update(ready(), QueueLimits(), now=2)) == [
        (1, WaitEnd.GRANTED),
        (2, WaitEnd.GRANTED),
    ]
    g.arrive(GateWaiter(3), starting, QueueLimits(), now=3)
    assert g.update(restart, QueueLimits(), now=3) == []
    evicted = EngineView(state=S.STOPPED, want_up=False)  # the evict won over the restart
    assert outcomes(g.update(evicted, QueueLimits(), now=4)) == [(3, WaitEnd.ATTEMPT_ENDED)]


def test_no_autoload_means_not_loaded_and_deadlines_time_out() -> None:
    g = Gate()
    stopped = EngineView(state=S.STOPPED, want_up=False)
    assert outcomes(g.arrive(GateWaiter(1, autoload=False), stopped, QueueLimits(), now=0)) == [
        (1, WaitEnd.NOT_LOADED)
    ]
    starting = EngineView(state=S.STARTING, want_up=True)
    g.arrive(GateWaiter(2, deadline=10), starting, QueueLimits(), now=0)
    assert g.update(starting, QueueLimits(), now=9.9) == []
    assert outcomes(g.update(starting, QueueLimits(), now=10)) == [(2, WaitEnd.TIMEOUT)]


def test_a_yielding_engine_serves_the_earlier_requests_and_holds_back_the_later() -> None:
    g, lim = Gate(), QueueLimits(max_concurrent=1)
    g.arrive(GateWaiter(1), ready(1), lim, now=0)
    assert g.hold_back(5) and not g.hold_back(7)  # the earliest cut is in force
    g.arrive(GateWaiter(6), ready(1), lim, now=0)
    assert g.waits_before(5)
    assert outcomes(g.update(ready(0), lim, now=1)) == [(1, WaitEnd.GRANTED)]
    assert not g.waits_before(5) and g.update(ready(0), lim, now=1) == []
    # Evicted for the swap: the held-back request brings it back.
    stopped = EngineView(state=S.STOPPED, want_up=False)
    assert outcomes(g.update(stopped, lim, now=2)) == ["launch"]
    g.release(5)
    assert outcomes(g.update(ready(0), lim, now=3)) == [(6, WaitEnd.GRANTED)]


def test_who_waits_on_past_a_load_that_ended_ready_is_loaded_again_not_failed() -> None:
    """A lease that came during the load, saw it ready and still waits (no slot, or
    behind a swap's cutoff) rides nothing any more: when the engine then stops or falls
    asleep it asks for the engine again (issue 40: it was answered "attempt ended")."""
    g, lim = Gate(), QueueLimits(max_concurrent=1)
    starting = EngineView(state=S.STARTING, want_up=True)
    g.arrive(GateWaiter(1), starting, lim, now=0)
    g.arrive(GateWaiter(2), starting, lim, now=0)
    assert outcomes(g.update(ready(), lim, now=1)) == [(1, WaitEnd.GRANTED)]
    asleep = EngineView(state=S.ASLEEP, want_up=False)  # put to sleep for another's swap
    assert outcomes(g.update(asleep, lim, now=2)) == ["launch"]


def test_leases_past_max_queue_are_refused_claims_never() -> None:
    g, lim = Gate(), QueueLimits(max_concurrent=1, max_queue=1)
    g.arrive(GateWaiter(1), ready(1), lim, now=0)
    assert outcomes(g.arrive(GateWaiter(2), ready(1), lim, now=0)) == [(2, WaitEnd.QUEUE_FULL)]
    assert g.arrive(GateWaiter(3, claim=True), ready(1), lim, now=0) == []  # its frontend counts


def test_shutdown_and_removal_answer_everyone() -> None:
    g = Gate()
    g.arrive(GateWaiter(1), EngineView(state=S.STARTING, want_up=True), QueueLimits(), now=0)
    g.arrive(GateWaiter(2), EngineView(state=S.STARTING, want_up=True), QueueLimits(), now=0)
    gone = EngineView(state=S.STARTING, want_up=True, retired=True)
    assert outcomes(g.update(gone, QueueLimits(), now=1)) == [
        (1, WaitEnd.REMOVED),
        (2, WaitEnd.REMOVED),
    ]
    closing = EngineView(state=S.READY, want_up=True, closing=True)
    assert outcomes(g.arrive(GateWaiter(3), closing, QueueLimits(), now=1)) == [(3, WaitEnd.CLOSED)]


class GateMachine(RuleBasedStateMachine):
    """One engine's gate against an engine that loads, fails, is evicted, crashes; leases
    end; swaps begin and end; the clock runs. What must hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()
        self.limits = QueueLimits(max_concurrent=2, max_queue=2)
        self.state = S.STOPPED
        self.want_up = False
        self.restarting = False  # a reload's restart: down, then up again
        self.retry_in = 0.0
        self.now = 0.0
        self.ticket = 0
        self.leases = 0  # granted leases in flight
        self.claims = 0  # granted claims (reported busy: 0, they count nothing here)
        self.answered: dict[int, WaitEnd] = {}
        self.waiting: dict[int, GateWaiter] = {}
        self.granted_order: list[int] = []
        self.saw_ready: set[int] = set()  # waiters that saw the engine ready while waiting
        self.swaps: list[int] = []  # the cuts of the swaps under way (the model's own count)

    def view(self) -> EngineView:
        return EngineView(
            state=self.state,
            want_up=self.want_up,
            in_flight=self.leases,
            retry_in=self.retry_in,
            restarting=self.restarting,
        )

    def apply(self, actions: list[adm.GateAction]) -> None:
        for a in actions:
            if isinstance(a, adm.WantUp):
                assert self.state in (S.STOPPED, S.FAILED) and not self.want_up
                self.want_up = True
                continue
            assert a.ticket not in self.answered, "answered twice"
            w = self.waiting.pop(a.ticket)
            self.answered[a.ticket] = a.outcome
            if a.outcome == WaitEnd.GRANTED:
                assert self.state == S.READY
                assert all(a.ticket < cut for cut in self.swaps), "granted past a swap's cut"
                self.granted_order.append(a.ticket)
                if w.claim:
                    self.claims += 1
                else:
                    self.leases += 1
            if a.outcome == WaitEnd.TIMEOUT:
                assert w.deadline <= self.now
            if a.outcome == WaitEnd.ATTEMPT_ENDED:
                assert not self.restarting, "a restart's stop ended the load it waited for"
                # Only a load that ended without ready is an attempt's end for its riders;
                # one who saw it ready and still waits (for a slot, behind a swap) is owed
                # a load or a wake by the next stop, not that old load's end.
                assert a.ticket not in self.saw_ready, "answered with a load that succeeded"

    def update(self) -> None:
        if self.state == S.READY:
            self.saw_ready |= set(self.waiting)
        self.apply(self.gate.update(self.view(), self.limits, self.now))

    @rule(
        claim=st.booleans(), autoload=st.booleans(), patience=st.sampled_from([1.0, 5.0, math.inf])
    )
    def arrive(self, claim: bool, autoload: bool, patience: float) -> None:
        self.ticket += 1
        w = GateWaiter(self.ticket, claim=claim, autoload=autoload, deadline=self.now + patience)
        self.waiting[w.ticket] = w
        self.apply(self.gate.arrive(w, self.view(), self.limits, self.now))

    @precondition(lambda self: self.state == S.STOPPED and self.want_up)
    @rule()
    def supervisor_starts(self) -> None:
        self.state = S.STARTING
        self.saw_ready.clear()  # everyone waiting rides this new load
        self.update()

    @precondition(lambda self: self.state == S.STARTING)
    @rule(ok=st.booleans())
    def load_ends(self, ok: bool) -> None:
        if ok:
            self.state = S.READY
        else:
            self.state, self.want_up, self.retry_in = S.FAILED, False, 3.0
        self.update()

    @precondition(lambda self: self.state in (S.READY, S.STARTING))
    @rule(drain=st.booleans())
    def evict(self, drain: bool) -> None:
        """An evict (or a crash when not drained): straight down, or through a drain."""
        self.want_up = False
        if drain and self.state == S.READY:
            self.state = S.DRAINING
        else:
            self.state, self.leases, self.claims = S.STOPPED, 0, 0
        self.update()

    @precondition(lambda self: self.state in (S.READY, S.STARTING) and not self.restarting)
    @rule()
    def reload_restarts_it(self) -> None:
        """A reload changed its launch: down (leases end first: restart-when-idle)..."""
        if self.leases:
            return
        self.want_up, self.restarting = False, True
        self.state, self.claims = S.STOPPED, 0
        self.update()

    @precondition(lambda self: self.restarting and self.state == S.STOPPED)
    @rule(evicted=st.booleans())
    def restart_goes_on(self, evicted: bool) -> None:
        """... then up with the new launch, unless an evict came meanwhile."""
        self.restarting = False
        self.want_up = not evicted
        self.update()

    @precondition(lambda self: self.state == S.DRAINING)
    @rule()
    def drained(self) -> None:
        self.state, self.leases, self.claims = S.STOPPED, 0, 0
        self.update()

    @precondition(lambda self: self.leases > 0)
    @rule()
    def lease_ends(self) -> None:
        self.leases -= 1
        self.update()

    @precondition(lambda self: len(self.swaps) < 3)  # swaps may overlap
    @rule()
    def swap_begins(self) -> None:
        self.ticket += 1
        self.swaps.append(self.ticket)
        self.gate.hold_back(self.ticket)
        self.update()

    @precondition(lambda self: bool(self.swaps))
    @rule(which=st.integers(0, 2))
    def swap_ends(self, which: int) -> None:
        """Any of the swaps under way ends (not only the earliest)."""
        self.gate.release(self.swaps.pop(which % len(self.swaps)))
        self.update()

    @rule(dt=st.sampled_from([0.5, 2.0, 10.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.retry_in = max(0.0, self.retry_in - dt)
        self.update()

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def client_leaves(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.gate.leave(ticket)
        del self.waiting[ticket]
        self.update()

    @invariant()
    def leases_within_max_concurrent(self) -> None:
        assert self.limits.max_concurrent is not None
        assert self.leases <= self.limits.max_concurrent

    @invariant()
    def served_in_arrival_order(self) -> None:
        assert self.granted_order == sorted(self.granted_order)

    @invariant()
    def line_is_exactly_the_unanswered(self) -> None:
        assert sorted(w.ticket for w in self.gate.line) == sorted(self.waiting)

    @invariant()
    def nobody_waits_with_nothing_to_wake_it(self) -> None:
        """Each waiter waits for something that will happen: a load under way or asked for,
        a slot (a lease in flight ends), a swap's end, or its own deadline."""
        if not self.gate.line:
            return
        if self.state in (S.STOPPED, S.FAILED):
            assert self.want_up or self.restarting, "stopped, not wanted, and requests wait"
        if self.state == S.READY:
            head = self.gate.line[0]
            held_back = any(head.ticket >= cut for cut in self.swaps)
            assert held_back or (not head.claim and self.limits.free(self.leases) == 0)

    @invariant()
    def no_waiter_past_its_deadline(self) -> None:
        assert all(w.deadline > self.now for w in self.gate.line)


TestGate = GateMachine.TestCase
TestGate.settings = budget(400, stateful_step_count=50, deadline=None)


# ---------------------------------------------------------------- the desk


def grant(claim: str = "c1", limits: QueueLimits | None = None) -> adm.ClaimGrant:
    return adm.ClaimGrant(claim=claim, alias="m", url="http://e", limits=limits or QueueLimits())


def kinds(actions: list[adm.DeskAction]) -> list[str]:
    return [type(a).__name__ for a in actions if not isinstance(a, adm.Tell)]


def test_a_cold_model_asks_one_claim_for_any_number_of_requests() -> None:
    d = adm.Desk()
    _, acts = d.arrive("m", 0.0)
    assert kinds(acts) == ["Fetch"]
    _, acts = d.arrive("m", 0.0)
    assert kinds(acts) == []  # rides the same Claim
    acts = d.granted("m", grant(), 1.0)
    assert kinds(acts) == ["Grant", "Grant"]
    assert d.claims["c1"].in_flight == 2


def test_max_queue_0_means_the_same_on_a_fresh_frontend_and_after_an_evict() -> None:
    """The regression: once the limits were known, a model whose claim went back (an
    evict) turned every request away with 429 "0 request(s) already waiting"."""
    lim = QueueLimits(max_concurrent=None, max_queue=0)
    fresh = adm.Desk()
    fresh.limits({"m": lim})
    _, acts = fresh.arrive("m", 0.0)
    assert kinds(acts) == ["Fetch"]  # the first request loads the model
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(limits=lim), 1.0)
    [held] = d.claims.values()
    d.ended(held, 2.0)
    assert kinds(d.recall("c1", drain=True, idle=0.0, now=3.0)) == ["GiveBack"]  # evicted
    _, acts = d.arrive("m", 4.0)
    assert kinds(acts) == ["Fetch"]  # waits for the reload, as on a fresh frontend


def test_max_concurrent_and_max_queue_at_the_desk() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(limits=QueueLimits(max_concurrent=1, max_queue=1)), 0.0)
    _, acts = d.arrive("m", 0.0)
    assert kinds(acts) == []  # waits for the slot (queued: 1 of 1)
    _, acts = d.arrive("m", 0.0)
    [refusal] = acts
    assert isinstance(refusal, adm.Refuse) and isinstance(refusal.reason, adm.QueueFull)
    assert str(refusal.reason) == "1 request(s) already waiting (max_queue 1)"
    assert kinds(d.ended(d.claims["c1"], 1.0)) == ["Grant"]


def test_the_end_of_a_request_lets_the_next_one_in() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(limits=QueueLimits(max_concurrent=1)), 0.0)
    waiting, _ = d.arrive("m", 0.0)
    [nxt] = [a for a in d.ended(d.claims["c1"], 1.0) if isinstance(a, adm.Grant)]
    assert nxt.rid == waiting and d.claims["c1"].in_flight == 1


def _granted(actions: list[adm.DeskAction]) -> list[int]:
    return [a.rid for a in actions if isinstance(a, adm.Grant)]


def test_a_line_is_served_by_priority_then_arrival() -> None:
    low, high = adm.KeyTerms("low", priority=0), adm.KeyTerms("high", priority=3)
    d = adm.Desk()
    first, _ = d.arrive("m", 0.0, key=low)
    d.granted("m", grant(limits=QueueLimits(max_concurrent=1)), 0.0)
    a, _ = d.arrive("m", 0.0, key=low)
    b, _ = d.arrive("m", 0.0, key=high)
    c, _ = d.arrive("m", 0.0, key=high)
    held = d.claims["c1"]
    order = []
    for who in (low, high, high, low):
        order += _granted(d.ended(held, 1.0, who.name))
    assert order == [b, c, a]  # the two high ones first, in their order; then the low one
    assert d.asks == {} and first not in order


def test_a_low_priority_request_is_overtaken_a_bounded_number_of_times() -> None:
    low, high = adm.KeyTerms("low"), adm.KeyTerms("high", priority=1)
    d = adm.Desk(overtake_limit=2)
    d.arrive("m", 0.0, key=high)
    d.granted("m", grant(limits=QueueLimits(max_concurrent=1)), 0.0)
    patient, _ = d.arrive("m", 0.0, key=low)
    held = d.claims["c1"]
    served = []
    for _ in range(3):  # high-priority requests keep arriving
        d.arrive("m", 0.0, key=high)
        served += _granted(d.ended(held, 1.0, "high"))
    assert patient in served and served.index(patient) == 2  # after two overtakes


def test_a_key_past_max_concurrent_is_refused_and_its_end_lets_it_in() -> None:
    capped = adm.KeyTerms("team", max_concurrent=1)
    d = adm.Desk()
    first, acts = d.arrive("m", 0.0, key=capped)
    assert kinds(acts) == ["Fetch"]  # waiting counts: it is the key's one request
    _, acts = d.arrive("m", 0.0, key=capped)
    [refusal] = acts
    assert isinstance(refusal, adm.Refuse) and isinstance(refusal.reason, adm.KeyBusy)
    assert "max_concurrent" in str(refusal.reason)
    _, acts = d.arrive("m", 0.0)  # another key is not held back by it
    assert kinds(acts) == []
    assert _granted(d.granted("m", grant(), 1.0))[0] == first
    d.ended(d.claims["c1"], 2.0, "team")
    _, acts = d.arrive("m", 2.0, key=capped)
    assert kinds(acts) == ["Grant"]


def test_a_raised_limit_lets_waiters_in_at_once() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(limits=QueueLimits(max_concurrent=1)), 0.0)
    d.arrive("m", 0.0)
    assert kinds(d.limits({"m": QueueLimits(max_concurrent=2)})) == ["Grant"]


def test_a_drain_recall_stops_routing_and_the_claim_goes_back_after_its_last_request() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(), 0.0)
    held = d.claims["c1"]
    assert kinds(d.recall("c1", drain=True, idle=0.0, now=1.0)) == []
    assert not held.routing
    _, acts = d.arrive("m", 1.5)
    assert kinds(acts) == ["Fetch"]  # a new claim for the new request
    assert kinds(d.ended(held, 2.0)) == ["GiveBack"]


def test_an_idle_recall_is_kept_while_busy_and_answered_by_the_report() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(), 0.0)
    held = d.claims["c1"]
    acts = d.recall("c1", drain=False, idle=60.0, now=1.0)
    assert kinds(acts) == [] and any(isinstance(a, adm.Tell) for a in acts)
    d.ended(held, 2.0)
    assert kinds(d.recall("c1", drain=False, idle=60.0, now=30.0)) == []  # idle 28 s < 60
    assert kinds(d.recall("c1", drain=False, idle=60.0, now=62.0)) == ["GiveBack"]


def test_a_restart_recall_waits_for_the_first_idle_moment() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(), 0.0)
    assert kinds(d.recall("c1", drain=False, idle=0.0, now=1.0)) == []
    assert kinds(d.ended(d.claims["c1"], 2.0)) == ["GiveBack"]


def test_a_lost_daemon_refuses_who_waits_for_it_and_held_claims_keep_serving() -> None:
    d = adm.Desk()
    d.arrive("m", 0.0)
    d.granted("m", grant(), 0.0)
    d.arrive("n", 0.0)
    acts = d.daemon_lost("gone")
    assert kinds(acts) == ["Refuse"]
    _, acts = d.arrive("m", 1.0)
    assert kinds(acts) == ["Grant"]


def test_a_claim_timeout_refuses_only_those_it_was_asked_for() -> None:
    d = adm.Desk()
    first, acts = d.arrive("m", 0.0, load_timeout=10)
    [fetch] = [a for a in acts if isinstance(a, adm.Fetch)]
    later, _ = d.arrive("m", 5.0, load_timeout=10)
    assert fetch.asked == (first,)
    acts = d.fetch_failed("m", "timeout", only=fetch.asked)
    assert [type(a).__name__ for a in acts if not isinstance(a, adm.Tell)] == ["Refuse", "Fetch"]
    assert list(d.lines["m"].waiting) == [later]


def test_load_timeout_at_the_desk() -> None:
    d = adm.Desk()
    rid, _ = d.arrive("m", 0.0, load_timeout=10)
    assert d.next_deadline() == 10 and kinds(d.tick(9.0)) == []
    [refusal] = [a for a in d.tick(10.0) if isinstance(a, adm.Refuse)]
    assert refusal.rid == rid and isinstance(refusal.reason, adm.Timeout)


@pytest.mark.parametrize("drain", [True, False])
def test_a_recall_for_a_claim_we_do_not_hold_is_answered(drain: bool) -> None:
    assert kinds(adm.Desk().recall("x", drain=drain, idle=0.0, now=0.0)) == ["GiveBack"]


class DeskMachine(RuleBasedStateMachine):
    """One frontend's desk against a daemon that grants or refuses claims, recalls them
    (drain, TTL, restart), drops them, and goes away; requests arrive, end, give up."""

    MODELS = ("m", "n")
    #: Keys as the config may give them: none, a capped one, a low one, a high one.
    KEYS = (
        adm.ANYONE,
        adm.KeyTerms("capped", max_concurrent=1),
        adm.KeyTerms("low", priority=-1),
        adm.KeyTerms("high", priority=5),
    )

    def __init__(self) -> None:
        super().__init__()
        self.desk = adm.Desk(overtake_limit=2)  # small: the bound is reached in a run
        self.key_of: dict[int, adm.KeyTerms] = {}  # every request admitted, not ended
        self.priority: dict[int, int] = {}  # rid -> its key's priority
        self.now = 0.0
        self.fetching: dict[str, adm.Fetch] = {}
        self.running: dict[int, adm.Held] = {}  # granted requests in flight
        self.waiting: dict[int, str] = {}  # rid -> model
        self.answered: set[int] = set()
        self.given_back: set[str] = set()
        self.grants = 0
        self.order: dict[str, list[int]] = {m: [] for m in self.MODELS}
        self.limits = {
            "m": QueueLimits(max_concurrent=1, max_queue=1),
            "n": QueueLimits(max_queue=0),
        }

    def apply(self, actions: list[adm.DeskAction]) -> None:
        for a in actions:
            if isinstance(a, adm.Grant):
                assert a.rid not in self.answered
                self.answered.add(a.rid)
                model = self.waiting.pop(a.rid, None) or a.held.alias
                assert a.held.routing and a.held.id not in self.given_back
                limit = self.desk.lines[model].limits.max_concurrent
                assert limit is None or a.held.in_flight <= limit, "past max_concurrent"
                self.running[a.rid] = a.held
                self.order[model].append(a.rid)
            elif isinstance(a, adm.Refuse):
                assert a.rid not in self.answered
                self.answered.add(a.rid)
                self.waiting.pop(a.rid, None)
                self.key_of.pop(a.rid, None)
            elif isinstance(a, adm.Fetch):
                assert a.model not in self.fetching, "two Claims for one model"
                self.fetching[a.model] = a
            elif isinstance(a, adm.GiveBack):
                held = self.desk.claims.get(a.claim)
                assert held is None, "given back but still held"
                busy = [r for r, h in self.running.items() if h.id == a.claim]
                assert not busy, "a claim went back with requests on it"
                self.given_back.add(a.claim)

    @rule(
        model=st.sampled_from(MODELS),
        patience=st.sampled_from([0.0, 5.0]),
        key=st.sampled_from(KEYS),
    )
    def arrive(self, model: str, patience: float, key: adm.KeyTerms) -> None:
        active = sum(k.name == key.name for k in self.key_of.values())
        rid, actions = self.desk.arrive(model, self.now, load_timeout=patience, key=key)
        refused = [a.reason for a in actions if isinstance(a, adm.Refuse) and a.rid == rid]
        if refused and isinstance(refused[0], adm.KeyBusy):
            assert key.max_concurrent is not None and active >= key.max_concurrent
        else:  # a key within its limits is never refused for them
            assert key.max_concurrent is None or active < key.max_concurrent
        self.waiting[rid] = model
        self.key_of[rid] = key
        self.priority[rid] = key.priority
        self.apply(actions)

    @precondition(lambda self: bool(self.fetching))
    @rule(data=st.data(), ok=st.booleans())
    def daemon_answers(self, data: st.DataObject, ok: bool) -> None:
        model = data.draw(st.sampled_from(sorted(self.fetching)))
        fetch = self.fetching.pop(model)
        if ok:
            self.grants += 1
            g = adm.ClaimGrant(f"c{self.grants}", model, f"http://{model}", self.limits[model])
            self.apply(self.desk.granted(model, g, self.now))
        else:
            self.apply(self.desk.fetch_failed(model, "load failed", only=fetch.asked))

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def request_ends(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        held = self.running.pop(rid)
        self.apply(self.desk.ended(held, self.now, self.key_of.pop(rid).name))

    @precondition(lambda self: bool(self.desk.claims))
    @rule(data=st.data(), kind=st.sampled_from(["drain", "ttl", "restart"]))
    def daemon_recalls(self, data: st.DataObject, kind: str) -> None:
        claim = data.draw(st.sampled_from(sorted(self.desk.claims)))
        idle = {"drain": 0.0, "ttl": 3.0, "restart": 0.0}[kind]
        self.apply(self.desk.recall(claim, drain=kind == "drain", idle=idle, now=self.now))

    @precondition(lambda self: bool(self.given_back))
    @rule(data=st.data(), kind=st.sampled_from(["drain", "ttl", "restart"]))
    def a_recall_crosses_the_return(self, data: st.DataObject, kind: str) -> None:
        """The daemon's reply was on its way when the claim went back: the recall names a
        claim the desk no longer holds. Answered by another Return, and nothing else."""
        claim = data.draw(st.sampled_from(sorted(self.given_back)))
        idle = 3.0 if kind == "ttl" else 0.0
        actions = self.desk.recall(claim, drain=kind == "drain", idle=idle, now=self.now)
        assert actions == [adm.GiveBack(claim)]
        self.apply(actions)

    @precondition(lambda self: bool(self.desk.claims))
    @rule(data=st.data())
    def daemon_drops(self, data: st.DataObject) -> None:
        claim = data.draw(st.sampled_from(sorted(self.desk.claims)))
        self.apply(self.desk.dropped(claim))

    @rule(
        model=st.sampled_from(MODELS),
        cap=st.sampled_from([None, 1, 2]),
        q=st.sampled_from([None, 0, 1]),
    )
    def reload_changes_limits(self, model: str, cap: int | None, q: int | None) -> None:
        self.limits[model] = QueueLimits(cap, q)
        self.apply(self.desk.limits(dict(self.limits)))

    @rule()
    def daemon_lost(self) -> None:
        self.fetching.clear()
        self.apply(self.desk.daemon_lost("gone"))

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def client_leaves(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[rid]
        self.key_of.pop(rid)
        self.answered.add(rid)
        self.apply(self.desk.leave(rid))

    @rule(dt=st.sampled_from([1.0, 4.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.apply(self.desk.tick(self.now))

    @invariant()
    def in_flight_counted_right(self) -> None:
        for held in self.desk.claims.values():
            assert held.in_flight == sum(h is held for h in self.running.values())

    @invariant()
    def nobody_waits_with_nothing_to_wake_it(self) -> None:
        for model, line in self.desk.lines.items():
            if not line.waiting:
                continue
            if line.held is None or not line.held.routing:
                assert model in self.fetching and line.fetching, f"{model}: no Claim under way"
            else:
                assert not line.has_slot(), f"{model}: a free slot and requests waiting"

    @invariant()
    def waiting_is_exactly_the_unanswered(self) -> None:
        queued = {rid for line in self.desk.lines.values() for rid in line.waiting}
        assert queued == set(self.waiting)

    @invariant()
    def served_in_arrival_order_within_a_priority(self) -> None:
        for granted in self.order.values():
            for level in {self.priority[r] for r in granted}:
                same = [r for r in granted if self.priority[r] == level]
                assert same == sorted(same)

    @invariant()
    def no_key_past_its_limits(self) -> None:
        active: dict[str, int] = {}
        for key in self.key_of.values():
            active[key.name] = active.get(key.name, 0) + 1
        for key in self.KEYS:
            use = self.desk.keys.get(key.name)
            assert (use.active if use else 0) == active.get(key.name, 0), key.name
            if key.max_concurrent is not None:
                assert active.get(key.name, 0) <= key.max_concurrent, key.name

    @invariant()
    def overtaken_within_the_bound(self) -> None:
        for ask in self.desk.asks.values():
            assert ask.overtaken <= self.desk.overtake_limit


TestDesk = DeskMachine.TestCase
TestDesk.settings = budget(400, stateful_step_count=50, deadline=None)
