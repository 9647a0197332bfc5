"""Idle expiry (``ktd.core.expiry``): client expiry that a paused daemon never gets wrong,
and an idle TTL that never evicts an engine someone holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ktd.core import states as S
from ktd.core.expiry import EvictIdle, Expiry, IdleView, RecallIdle, SleepIdle, ttl_due
from tests.hypo import budget


def view(**kw: object) -> IdleView:
    base: dict[str, object] = {
        "alias": "m",
        "ttl": 60.0,
        "state": S.READY,
        "want_up": True,
        "in_flight": 0,
        "claims": 0,
        "waiting": 0,
        "idle_since": 100.0,
    }
    return IdleView(**{**base, **kw})  # type: ignore[arg-type]


def test_ttl_counts_from_the_last_request_and_never_while_held_busy_or_going() -> None:
    assert ttl_due(view()) == 160.0
    assert ttl_due(view(in_flight=1)) is None
    assert ttl_due(view(waiting=2)) is None  # requests wait for it: not idle
    assert ttl_due(view(ttl=0.0)) is None
    assert ttl_due(view(state=S.STARTING)) is None
    assert ttl_due(view(want_up=False)) is None


def test_a_sleep_model_sleeps_at_its_ttl_and_is_stopped_at_its_sleep_ttl() -> None:
    e = Expiry(lease_ttl=15, now=195.0)
    acts, _ = e.idle([view(alias="s", sleeps=True), view(alias="h", sleeps=True, claims=1)], 199.0)
    assert acts == [SleepIdle("s", 60.0), RecallIdle("h", 60.0)]
    asleep = view(alias="s", state=S.ASLEEP, want_up=False, sleeps=True, asleep_at=150.0)
    assert ttl_due(asleep) is None  # no sleep_ttl: asleep for good
    asleep = view(**{**asleep.__dict__, "sleep_ttl": 30.0})
    assert ttl_due(asleep) == 180.0
    assert ttl_due(view(**{**asleep.__dict__, "waiting": 1})) is None  # a wake is wanted
    acts, _ = e.idle([asleep], 199.0)
    assert acts == [EvictIdle("s", 30.0)]


def test_an_idle_engine_with_claims_is_recalled_one_without_is_evicted() -> None:
    e = Expiry(lease_ttl=15, now=0.0)
    e.sweep(5.0)
    acts, _ = e.idle([view(alias="held", claims=1), view(alias="free")], now=200.0 - 195)
    assert acts == []
    e = Expiry(lease_ttl=15, now=195.0)
    acts, nxt = e.idle(
        [view(alias="held", claims=1), view(alias="free"), view(alias="later", idle_since=180)],
        now=199.0,
    )
    assert acts == [RecallIdle("held", 60.0), EvictIdle("free", 60.0)]
    assert nxt == 240.0


def test_silent_clients_expire_and_a_late_sweep_credits_everyone_the_lost_time() -> None:
    e = Expiry(lease_ttl=15, now=0.0)
    e.heard("alive", 0.0)
    e.heard("dead", 0.0)
    for t in (5.0, 10.0, 15.0):
        assert e.sweep(t) is None
        e.heard("alive", t)
    verdict = e.sweep(20.0)
    assert verdict is not None and verdict.clients == {"dead"}
    # Stopped for a minute: the 55 s the sweep lost are nobody's silence.
    assert e.sweep(80.0) is None and e.paused == 1
    assert e.seen["alive"] == 15.0 + 55.0
    # A sweep a little late (starved, not stopped) credits its lateness too.
    e.heard("alive", 80.0)
    e.heard("quiet", 70.0)
    assert e.sweep(88.0) is None and e.paused == 1  # 3 s late: no pause, but no expiry
    assert e.seen["quiet"] == 73.0


def test_no_ttl_decision_while_the_reports_of_a_pause_are_still_unread() -> None:
    e = Expiry(lease_ttl=15, now=0.0)
    e.sweep(5.0)
    stale = view(idle_since=0.0, ttl=3.0)
    assert e.idle([stale], now=9.0)[0] == [EvictIdle("m", 3.0)]
    # A pause: the sweep after it settles for one interval before judging idleness.
    assert e.sweep(60.0) is None
    acts, nxt = e.idle([stale], now=60.0)
    assert acts == [] and nxt == 65.0
    # Overdue sweep, not yet run (the pump woke first): nothing judged either.
    e2 = Expiry(lease_ttl=15, now=0.0)
    assert e2.idle([stale], now=30.0)[0] == []


@given(
    st.lists(
        st.builds(
            view,
            alias=st.sampled_from("abcd"),
            ttl=st.sampled_from([0.0, 3.0, 60.0]),
            state=st.sampled_from(S.ALL),
            want_up=st.booleans(),
            in_flight=st.integers(0, 2),
            claims=st.integers(0, 2),
            waiting=st.integers(0, 2),
            idle_since=st.floats(0, 1000),
        ),
        max_size=6,
    ),
    st.floats(0, 2000),
)
def test_only_an_engine_nobody_holds_is_ever_evicted(views: list[IdleView], now: float) -> None:
    e = Expiry(lease_ttl=15, now=now - 1)
    acts, _ = e.idle(views, now)
    for act in acts:
        held = [v for v in views if v.alias == act.alias]
        if isinstance(act, EvictIdle):
            assert any(v.claims == 0 and v.in_flight == 0 and v.waiting == 0 for v in held)
        due = [ttl_due(v) for v in held]
        assert any(d is not None and d <= now for d in due)


class ClientsMachine(RuleBasedStateMachine):
    """Frontends heartbeating every ``lease_ttl / 3`` (as ``ktd frontend`` does) to a
    daemon that runs its sweep every ``lease_ttl / 3``, or is stopped for a while, after
    which the queued heartbeats and the late sweep come in either order."""

    TTL = 6.0

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.expiry = Expiry(self.TTL, self.now)
        self.clients = {f"c{i}": True for i in range(3)}  # alive?
        self.sent = dict.fromkeys(self.clients, 0.0)  # last heartbeat sent
        self.queued: set[str] = set()  # heartbeats sent while the daemon was stopped
        self.dead_for = dict.fromkeys(self.clients, 0.0)  # running time since death
        self.expired: set[str] = set()
        for c in self.clients:
            self.expiry.heard(c, 0.0)

    def sweep(self, at: float) -> None:
        verdict = self.expiry.sweep(at)
        if verdict is not None:
            assert all(not self.clients[c] for c in verdict.clients), "a live client expired"
            self.expired |= verdict.clients

    def beat(self, *, paused: bool) -> None:
        hb = self.TTL / 3
        for c, alive in self.clients.items():
            if alive and self.now - self.sent[c] >= hb:
                self.sent[c] = self.now
                if paused:
                    self.queued.add(c)
                elif c not in self.expired:
                    self.expiry.heard(c, self.now)

    @rule(steps=st.integers(1, 12))
    def run_for(self, steps: int) -> None:
        """The daemon runs: heartbeats arrive as sent, the sweep runs on time. (A dead
        client's clock counts the daemon's running time since its death.)"""
        for _ in range(steps):
            self.now += self.expiry.interval / 2
            self.beat(paused=False)
            if self.now >= self.expiry.next_sweep():
                self.sweep(self.now)
            for c, alive in self.clients.items():
                if not alive:
                    self.dead_for[c] += self.expiry.interval / 2

    @rule(seconds=st.floats(0.5, 30), sweep_first=st.booleans())
    def stopped_for(self, seconds: float, sweep_first: bool) -> None:
        """SIGSTOP: nothing runs; the clients keep sending. On SIGCONT, the late sweep
        and the socket's backlog run in either order."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + self.TTL / 3)
            self.beat(paused=True)
        backlog = [c for c in self.queued if c not in self.expired]
        self.queued.clear()
        if sweep_first:
            self.sweep(self.now)
        for c in backlog:
            self.expiry.heard(c, self.now)
        if not sweep_first and self.now >= self.expiry.next_sweep():
            self.sweep(self.now)

    @precondition(lambda self: any(self.clients.values()))
    @rule(data=st.data())
    def client_dies(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(sorted(k for k, v in self.clients.items() if v)))
        self.clients[c] = False

    @invariant()
    def a_client_dead_long_enough_is_expired(self) -> None:
        for c, alive in self.clients.items():
            if not alive and self.dead_for[c] > self.TTL + 2 * self.expiry.interval:
                assert c in self.expired, f"{c} dead for {self.dead_for[c]}s, not expired"


TestClients = ClientsMachine.TestCase
TestClients.settings = budget(500, stateful_step_count=50, deadline=None)
