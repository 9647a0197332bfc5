"""The engine lifecycle machine (``ktd.core.lifecycle``): unit cases and a hypothesis
state machine that drives it against a simulated engine and checks, after every step,
that nothing generating reaches a released engine, that a release never happens while
anything is held or running (requests the daemon cannot see included: SGLang's load
count misses a request while it is tokenized and in its first prefill), that an asleep
engine is stopped without a wake, and that every wanted engine ends ready, asleep or
down within its bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ktd.core import lifecycle as L
from ktd.core import states as S
from ktd.core.exits import Outcome
from ktd.core.loads import EngineLoad
from tests.hypo import budget

SETTINGS = L.Settings(
    stop_grace=5.0,
    drain_timeout=10.0,
    hang_timeout=6.0,
    memory_timeout=4.0,
    restart_backoff=1.0,
    restart_max=3,
    restart_window=100.0,
)
HEALTH_TIMEOUT = 30.0
LOAD_TIME = 2.0


@dataclass
class World:
    """The engine and its users as the machine cannot see them: the simulated truth."""

    now: float = 0.0
    want: L.Want = L.Want.DOWN
    force: bool = False
    held: int = 0  # leases and claims
    engine_busy: int = 0  # requests the engine itself counts (/v1/loads)
    # Requests inside the engine its load snapshot does not show yet (tokenized, in their
    # first prefill): they show at ``hidden_until``.
    hidden: int = 0
    hidden_until: float = math.inf
    snapshot_at: float = 0.0  # when the snapshot /v1/loads answers with was taken
    loads_answer: bool = True  # /v1/loads answers
    has_door: bool = True  # this SGLang has /pause_generation and /flush_cache
    routers_confirm: bool = True  # every router confirms a deregistration
    door_closed: bool = False  # new generations wait in the tokenizer
    at_door: int = 0  # generations waiting behind the closed door
    # Aborted by the door's closing, still in the scheduler until its forward pass ends
    # (a long prefill's: seconds), then gone, and a snapshot counting nothing published.
    aborted: int = 0
    aborted_until: float = 0.0
    alive: bool = False
    loaded_at: float = math.inf  # healthy from then on
    crashed: Outcome | None = None
    hung: bool = False
    released: bool = False  # the engine's memory, as the engine knows it
    release_ok: bool = True
    resume_ok: bool = True
    room_ok: bool = True
    launch_ok: bool = True
    log: list[str] = field(default_factory=list)

    def scheduler(self) -> int:
        """Requests the scheduler holds, shown or not."""
        if self.aborted and self.now >= self.aborted_until:
            self.aborted, self.snapshot_at = 0, self.aborted_until
        return self.engine_busy + self.hidden + self.aborted

    def reading(self) -> EngineLoad | None:
        if not self.loads_answer:
            return None
        if self.scheduler() and self.aborted:  # the old snapshot, until the pass ends
            return EngineLoad(self.engine_busy, 16 * self.engine_busy, self.snapshot_at)
        if self.hidden and self.now >= self.hidden_until:
            self.engine_busy += self.hidden
            self.hidden, self.snapshot_at = 0, self.hidden_until
        return EngineLoad(self.engine_busy, 16 * self.engine_busy, self.snapshot_at)

    def traffic(self, visible: int, hidden: int = 0, *, shows_in: float = math.inf) -> None:
        """Requests sent straight to the engine (a router, a client ktd never saw): they
        wait behind a closed door; on released memory they would run on freed memory."""
        if self.door_closed:
            self.at_door += visible + hidden
            return
        if (visible or hidden) and self.released:
            raise Violation("a generation reached the scheduler while released")
        self.engine_busy, self.hidden = visible, hidden
        self.hidden_until = self.now + shows_in
        self.snapshot_at = self.now

    def look(self, m: L.Lifecycle) -> L.Look:
        return L.Look(
            now=self.now,
            want=self.want,
            force=self.force,
            held=self.held,
            healthy=self.alive and self.now >= self.loaded_at,
            hung=self.hung and m.state == S.READY,
            exited=self.crashed if self.alive and self.crashed else None,
        )


class Violation(AssertionError):
    pass


def drive(m: L.Lifecycle, w: World, *, steps: int = 60, until: float | None = None) -> None:
    """Carry out the machine's actions on the simulated world until it waits for
    something the world will not do by itself (or ``until`` on the clock)."""
    for _ in range(steps):
        if m.settle_want is not None:  # the driver applies what an attempt's end says
            w.want, m.settle_want = m.settle_want, None
        action = m.step(w.look(m))
        w.log.append(f"{w.now:.2f} {m.state} {type(action).__name__}")
        if m.state in (S.STARTING, S.READY) and m.memory_released:
            raise Violation("probing state with the memory released")
        match action:
            case L.Idle():
                return
            case L.Wait(until=t):
                nxt = t
                if w.alive and w.loaded_at > w.now:
                    nxt = min(nxt, w.loaded_at)
                if until is not None:
                    if w.now >= until:
                        return
                    nxt = min(nxt, until)
                if nxt == math.inf:
                    return
                w.now = max(w.now, nxt)
            case L.Launch():
                if w.launch_ok:
                    w.alive, w.crashed, w.hung, w.released = True, None, False, False
                    w.loaded_at = w.now + LOAD_TIME
                    m.launched(None, w.now + HEALTH_TIMEOUT)
                else:
                    m.launched(Outcome("failed", "preflight refused"))
            case L.Deregister():
                m.deregistered(w.routers_confirm)
            case L.CheckLoad():
                m.load(w.now, w.reading())
                w.now += 0.05
            case L.Pause():
                if not w.has_door:
                    kill = m.paused(False, absent=True)
                else:  # the door closes; what is in flight is aborted, gone once the
                    # scheduler's current forward pass ends
                    w.door_closed = True
                    w.aborted = w.scheduler()
                    w.aborted_until = w.now + (3.0 if w.hidden else 0.1)
                    w.hidden_until = math.inf
                    kill = m.paused(True, at=w.now)
                    w.engine_busy = w.hidden = 0
                if kill is not None:
                    _kill(m, w, kill)
            case L.Flush():
                m.flushed(w.now, w.has_door and not w.scheduler(), absent=not w.has_door)
                w.now += 0.05
            case L.ReleaseMemory():
                if w.held or w.scheduler():
                    raise Violation(f"release with {w.held} held, {w.scheduler()} running")
                if not w.alive:
                    raise Violation("release sent to a dead engine")
                if w.release_ok:
                    w.released = True
                kill = m.released(w.release_ok, None if w.release_ok else "HTTP 500")
                if kill is not None:
                    _kill(m, w, kill)
            case L.MakeRoom():
                m.room(w.room_ok, None if w.room_ok else "held by other", want=w.want)
            case L.Resume():
                if not w.alive:
                    raise Violation("resume sent to a dead engine")
                if w.resume_ok:
                    w.released = False
                kill = m.resumed(w.now, w.resume_ok, None if w.resume_ok else "timed out")
                if kill is not None:
                    _kill(m, w, kill)
            case L.Continue():
                if w.released:
                    raise Violation("SGLang's door opened on released memory")
                waiting, w.door_closed, w.at_door = w.at_door, False, 0
                w.traffic(w.engine_busy + waiting)
                kill = m.continued(w.has_door, absent=not w.has_door)
                if kill is not None:
                    _kill(m, w, kill)
            case L.CheckHealth():
                if w.released:
                    raise Violation("a generation sent to a released engine")
                m.checked(w.now, w.alive and not w.hung and not w.door_closed)
                w.now += 0.05
            case L.Kill() as kill:
                _kill(m, w, kill)


def _kill(m: L.Lifecycle, w: World, kill: L.Kill) -> None:
    w.now += min(kill.grace, 0.5)
    w.alive, w.released, w.crashed = False, False, None
    w.engine_busy = w.hidden = w.at_door = w.aborted = 0
    w.door_closed = False
    w.loaded_at = math.inf
    m.killed(w.now)


def machine(sleeps: bool = True) -> tuple[L.Lifecycle, World]:
    return L.Lifecycle(settings=SETTINGS, sleeps=sleeps), World()


def up(m: L.Lifecycle, w: World) -> None:
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.READY, w.log


# ---------------------------------------------------------------- unit cases


def test_a_load_becomes_ready_and_an_evict_drains_its_holders_first() -> None:
    m, w = machine()
    up(m, w)
    w.held = 1
    w.want = L.Want.DOWN
    drive(m, w, until=w.now + 1)
    assert m.state == S.DRAINING
    w.held = 0
    drive(m, w)
    assert m.state == S.STOPPED and not w.alive


def test_sleep_drains_to_zero_by_the_engines_own_count_before_releasing() -> None:
    m, w = machine()
    up(m, w)
    w.engine_busy = 2  # requests ktd does not know of (a router sent them)
    w.want = L.Want.ASLEEP
    drive(m, w, until=w.now + 1)
    assert m.state == S.SLEEPING and not w.released
    w.engine_busy = 0
    drive(m, w)
    assert m.state == S.ASLEEP and w.released and w.alive


def _actions(w: World) -> list[str]:
    return [line.split()[-1] for line in w.log]


def test_a_request_the_load_count_misses_is_aborted_behind_the_door_before_the_release() -> None:
    """A request in a long kt prefill that ``/v1/loads`` does not show (issue 40): zero
    readings say idle, SGLang's release would assert and take the server down. The door
    closes (the request is aborted there), the scheduler proves idle (flush), a reading
    taken after the door closed counts nothing: only then the release."""
    m, w = machine()
    up(m, w)
    w.traffic(0, 1, shows_in=60.0)
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert m.state == S.ASLEEP and w.released and w.door_closed
    acts = _actions(w)
    assert acts.index("Pause") < acts.index("Flush") < acts.index("ReleaseMemory")
    assert "CheckLoad" in acts[acts.index("Flush") : acts.index("ReleaseMemory")]


def test_a_zero_reading_taken_before_the_door_closed_proves_nothing() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w, until=w.now + 0.2)
    assert m.fence == L.Fence.PAUSED
    m.load(w.now, EngineLoad(0, 0, taken=m.barrier - 1.0))  # an old snapshot's zero
    assert not m._proven()
    m.load(w.now, EngineLoad(0, 0, taken=m.barrier + 0.1))
    assert m.flush is not True or m._proven()


def test_without_the_door_zero_readings_must_outlast_the_republish_interval() -> None:
    m, w = machine()
    w.has_door = False
    up(m, w)
    w.traffic(0, 1, shows_in=L.REPUBLISH * 0.75)  # shows in the next snapshot
    w.want = L.Want.ASLEEP
    drive(m, w, until=w.now + L.REPUBLISH * 0.5)
    assert m.state == S.SLEEPING and not w.released  # zero readings, not long enough
    drive(m, w, until=w.now + L.REPUBLISH)
    assert m.state == S.SLEEPING and w.engine_busy == 1  # it showed: the readings are not zero
    w.engine_busy = 0  # the request ends
    drive(m, w, steps=400)
    assert m.state == S.ASLEEP and m.fence == L.Fence.READS
    quiet = [ln for ln in w.log if ln.endswith("CheckLoad")]
    assert len(quiet) >= 2


def test_requests_at_the_closed_door_wait_for_the_resume_and_then_run() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.traffic(1)  # a client that kept the engine's URL and key
    assert w.at_door == 1 and not w.scheduler()
    w.want = L.Want.UP
    drive(m, w)
    acts = _actions(w)
    assert m.state == S.READY and acts.index("Resume") < acts.index("Continue")
    assert w.engine_busy == 1 and not w.door_closed


def test_a_sleep_whose_deregistration_a_router_did_not_confirm_is_a_stop() -> None:
    """Issue 40: a router that did not confirm (down, or too slow) still lists the engine:
    it would send requests and health checks to released memory. No release."""
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    assert isinstance(m.step(w.look(m)), L.Deregister)
    m.deregistered(confirmed=False)
    drive(m, w)
    assert m.state == S.STOPPED and "did not confirm" in (m.reason or "")
    assert "ReleaseMemory" not in _actions(w)


def test_a_door_that_will_not_close_stops_the_engine_instead() -> None:
    m = L.Lifecycle(settings=SETTINGS, sleeps=True)
    m.state, m.running, m.going = S.SLEEPING, True, S.SLEEPING
    kill = m.paused(False, why="HTTP 401")
    assert isinstance(kill, L.Kill) and m.state == S.STOPPING
    assert "did not hold new requests (HTTP 401)" in (m.reason or "")


@pytest.mark.parametrize(
    ("state", "step"), [(S.SLEEPING, "fencing"), (S.SLEEPING, "releasing"), (S.WAKING, "resuming")]
)
def test_an_engine_adopted_mid_sleep_is_loaded_afresh_never_resumed(
    state: S.State, step: str
) -> None:
    """A ktd restarted between closing the door (or the release call) and its record, or
    during a wake: released or not, SGLang would die of a resume of memory it holds or a
    generation on memory it released. Asleep until wanted, then stopped and loaded."""
    m, w = machine()
    w.alive, w.released, w.loaded_at, w.door_closed = True, True, 0.0, True
    m.adopt(state, w.now + 5, sleeps=True, step=step)
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert (
        m.state == S.ASLEEP
        and m.memory_unknown
        and not any("CheckHealth" in line for line in w.log)
    )
    w.want = L.Want.UP
    drive(m, w)
    acts = _actions(w)
    assert m.state == S.READY and "Resume" not in acts and acts.index("Kill") < acts.index("Launch")


def test_a_wake_resumes_then_checks_with_one_generation_then_is_ready() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.READY and not w.released
    assert any("CheckHealth" in line for line in w.log)


def test_an_asleep_engine_is_stopped_without_a_wake() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.log.clear()
    w.want = L.Want.DOWN
    drive(m, w)
    assert m.state == S.STOPPED
    assert not any("Resume" in line or "CheckHealth" in line for line in w.log)


def test_without_the_memory_saver_a_sleep_is_a_stop_never_a_release() -> None:
    m, w = machine(sleeps=False)
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert m.state == S.STOPPED and not any("Release" in line for line in w.log)


def test_a_drain_that_never_reaches_zero_stops_instead_of_sleeping() -> None:
    m, w = machine()
    up(m, w)
    w.held = 1
    w.want = L.Want.ASLEEP
    drive(m, w, steps=200)
    assert m.state == S.STOPPED and "instead of sleeping" in (m.reason or "")
    assert not any("Release" in line for line in w.log)


def test_an_engine_whose_load_count_cannot_be_read_is_never_released() -> None:
    m, w = machine()
    up(m, w)
    w.loads_answer = False
    w.want = L.Want.ASLEEP
    drive(m, w, steps=400)
    assert m.state == S.STOPPED and not any("Release" in line for line in w.log)


def test_a_failed_release_stops_the_engine() -> None:
    m, w = machine()
    up(m, w)
    w.release_ok = False
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert m.state == S.STOPPED and "sleep failed" in (m.reason or "")


def test_a_failed_resume_stops_it_says_why_and_the_next_request_loads_afresh() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.resume_ok = False
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.STOPPED and m.error_code == "load_failed"
    assert "wake failed" in (m.reason or "") and w.want == L.Want.DOWN
    w.resume_ok = True
    up(m, w)  # a cold load


def test_a_wake_that_finds_no_room_leaves_it_asleep_with_why() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.room_ok = False
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.ASLEEP and m.error_code == "busy" and w.want == L.Want.ASLEEP


def test_an_engine_that_dies_asleep_is_never_woken() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    drive(m, w)
    w.crashed = Outcome("crashed", "killed by signal 9")
    w.log.clear()
    drive(m, w)
    assert m.state == S.STOPPED and "exited while asleep" in (m.reason or "")
    assert w.want == L.Want.DOWN
    assert not any("Resume" in line for line in w.log)


def test_a_crash_of_a_ready_engine_restarts_it_and_flapping_fails_it() -> None:
    m, w = machine()
    up(m, w)
    for _ in range(SETTINGS.restart_max):
        w.crashed = Outcome("crashed", "boom")
        drive(m, w)
        assert m.state == S.READY
    w.crashed = Outcome("crashed", "boom")
    drive(m, w)
    assert m.state == S.FAILED and "flapping" in (m.reason or "")


def test_a_hung_engine_is_killed_and_restarted() -> None:
    m, w = machine()
    up(m, w)
    w.hung = True
    drive(m, w, steps=3)
    w.hung = False
    drive(m, w)
    assert m.state == S.READY


def test_an_adopted_asleep_engine_stays_asleep_and_unprobed_until_wanted() -> None:
    m, w = machine(sleeps=False)
    w.alive, w.released, w.loaded_at = True, True, 0.0
    m.adopt(S.ASLEEP, w.now + 5, sleeps=True)
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert m.state == S.ASLEEP and not any("CheckHealth" in line for line in w.log)
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.READY


def test_a_load_that_refuses_before_launch_fails_and_is_not_retried_by_itself() -> None:
    m, w = machine()
    w.launch_ok = False
    w.want = L.Want.UP
    drive(m, w)
    assert m.state == S.FAILED and w.want == L.Want.DOWN


def test_a_sleep_during_the_load_sleeps_once_ready() -> None:
    m, w = machine()
    w.want = L.Want.UP
    drive(m, w, until=0.5)
    assert m.state == S.STARTING
    w.want = L.Want.ASLEEP
    drive(m, w)
    assert m.state == S.ASLEEP


def test_force_cuts_the_drain() -> None:
    m, w = machine()
    up(m, w)
    w.held = 3
    w.want, w.force = L.Want.DOWN, True
    drive(m, w)
    assert m.state == S.STOPPED


def test_step_refuses_while_a_kill_is_unreported() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.DOWN
    action = m.step(w.look(m))
    assert isinstance(action, L.Deregister)
    m.deregistered()
    action = m.step(w.look(m))
    assert isinstance(action, L.Kill)
    with pytest.raises(RuntimeError):
        m.step(w.look(m))


# ---------------------------------------------------------------- the state machine


class LifecycleMachine(RuleBasedStateMachine):
    """Random wants, holders, engine traffic, crashes, hangs and failing memory calls,
    each followed by the driver's loop; the invariants hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.m = L.Lifecycle(settings=SETTINGS, sleeps=True)
        self.w = World()

    def _drive(self) -> None:
        drive(self.m, self.w, until=self.w.now + 0.5)

    @rule(want=st.sampled_from(list(L.Want)), force=st.booleans())
    def want(self, want: L.Want, force: bool) -> None:
        self.w.want = want
        self.w.force = force and want == L.Want.DOWN
        self._drive()

    @rule(delta=st.integers(-2, 2))
    def holders(self, delta: int) -> None:
        self.w.held = max(0, self.w.held + delta)
        self._drive()

    @rule(busy=st.integers(0, 2), answers=st.booleans())
    def engine_traffic(self, busy: int, answers: bool) -> None:
        # Straight to the engine (a router): only while it may be reached.
        if (self.m.state in (S.READY, S.SLEEPING) and not self.w.released) or busy == 0:
            self.w.traffic(busy)
        self.w.loads_answer = answers
        self._drive()

    @rule(busy=st.integers(1, 2), long_prefill=st.booleans())
    def requests_the_daemon_cannot_see(self, busy: int, long_prefill: bool) -> None:
        """Requests in the engine that neither a holder nor ``/v1/loads`` shows yet: a
        router's sent after the daemon's last reading, a stream whose client left during
        a long kt prefill. Without SGLang's door they show within its republish interval
        (or no fence could hold); behind a door, however long their prefill. Without a
        door they are sent only while the engine is on traffic: once every router has
        confirmed its deregistration nothing sends it more, and requests that kept coming
        after the zero readings are what no fence without a door can catch."""
        late = self.m.off_traffic and not self.w.has_door
        if (
            self.w.alive
            and self.m.state in (S.READY, S.SLEEPING)
            and not self.w.released
            and not late
        ):
            shows_in = 40.0 if long_prefill and self.w.has_door else L.REPUBLISH * 0.75
            self.w.traffic(self.w.engine_busy, busy, shows_in=shows_in)
        self._drive()

    @rule(confirm=st.booleans())
    def routers(self, confirm: bool) -> None:
        """A router of the gateway is up and answers, or not (its confirmation missing)."""
        self.w.routers_confirm = confirm
        self._drive()

    @precondition(lambda self: not self.w.alive)
    @rule(has_door=st.booleans())
    def sglang_version(self, has_door: bool) -> None:
        """The next launch's SGLang has the pause and flush routes, or not."""
        self.w.has_door = has_door

    @precondition(lambda self: self.w.alive)
    @rule(kind=st.sampled_from(["crashed", "failed", "exited"]))
    def crash(self, kind: str) -> None:
        self.w.crashed = Outcome(kind, f"{kind} by the test")  # type: ignore[arg-type]
        self.w.engine_busy = 0
        self._drive()

    @rule()
    def hang(self) -> None:
        self.w.hung = not self.w.hung
        self._drive()

    @rule(release=st.booleans(), resume=st.booleans(), room=st.booleans())
    def memory_calls(self, release: bool, resume: bool, room: bool) -> None:
        self.w.release_ok, self.w.resume_ok, self.w.room_ok = release, resume, room

    @rule(dt=st.floats(0.1, 40.0))
    def time_passes(self, dt: float) -> None:
        drive(self.m, self.w, steps=400, until=self.w.now + dt)

    @invariant()
    def states_match_the_world(self) -> None:
        m, w = self.m, self.w
        if m.state in (S.STOPPED, S.FAILED):
            assert not w.alive, "no process once stopped or failed"
        if m.state == S.ASLEEP:
            assert w.released and w.alive, "asleep means released and alive"
        if w.released:
            assert m.memory_released, "the machine knows the memory is released"
            assert m.state in (S.SLEEPING, S.ASLEEP, S.WAKING, S.STOPPING)

    @invariant()
    def a_wanted_engine_settles_within_its_bounds(self) -> None:
        """With a healthy world and nothing in the way, whatever is wanted is reached
        within the bounds: the load, the drain, the memory calls, the restart backoff."""
        m, w = self.m, self.w
        if w.hung or w.held or w.scheduler() or not w.loads_answer:
            return
        if not (w.release_ok and w.resume_ok and w.room_ok and w.launch_ok):
            return
        bound = (
            w.now
            + HEALTH_TIMEOUT
            + SETTINGS.drain_timeout
            + 2 * SETTINGS.memory_timeout
            + 60.0  # crash backoffs
        )
        drive(m, w, steps=2000, until=bound)
        want = w.want
        if want == L.Want.UP:
            assert m.state in (S.READY, S.FAILED), (m.state, w.log[-10:])
        elif want == L.Want.ASLEEP:
            assert m.state in (S.ASLEEP, S.STOPPED, S.FAILED), (m.state, w.log[-10:])
        else:
            assert m.state in (S.STOPPED, S.FAILED), (m.state, w.log[-10:])


LifecycleMachine.TestCase.settings = budget(max_examples=150, stateful_step_count=40, deadline=None)
test_lifecycle_machine = LifecycleMachine.TestCase


def test_an_engine_that_dies_while_it_drains_is_stopped_not_failed() -> None:
    """Found by the state machine: a crash during an evict's drain (requests still held)
    took the engine from draining to failed, a move the state table refuses."""
    m, w = machine()
    up(m, w)
    w.held = 1
    w.want = L.Want.DOWN
    drive(m, w, until=w.now + 1)
    assert m.state == S.DRAINING
    w.crashed = Outcome("crashed", "killed by signal 9")
    drive(m, w)
    assert m.state == S.STOPPED and "exited while draining" in (m.reason or "")
