"""Sleep or reload on an SGLang without ``/pause_generation`` (``ktd.core.sleepcost``,
issue 43, item 12): the decision against the measured figures, its bookkeeping, and the
lifecycle's stop instead of a sleep when it says so."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ktd.core import lifecycle as L
from ktd.core import sleepcost as C
from ktd.core import states as S
from ktd.core.loads import EngineLoad
from tests.core.test_lifecycle import machine, up
from tests.hypo import budget


def test_never_measured_a_reload_it_sleeps() -> None:
    assert C.without_door(C.Costs(), None) is None


def test_a_model_that_loads_faster_than_the_fence_alone_is_stopped_at_once() -> None:
    why = C.without_door(C.Costs(), 1.5)
    assert why is not None and why.startswith("stopped instead of sleeping")
    assert "no /pause_generation" in why and "1.5s for a reload" in why
    assert C.without_door(C.Costs(), 60.0) is None  # a slow load: the sleep is worth it


def test_the_issues_figures_a_measured_sleep_and_wake_slower_than_a_reload() -> None:
    """Two models alternating: a sleep of 3.0 s (the 2 s fence, the release) and a wake of
    2.6 s against a 4.9 s cold load: stopped instead, with the figures."""
    costs = C.Costs()
    costs.no_door(10.0, None)
    costs.asleep(13.0)
    costs.resume_asked(20.0)
    costs.ready(22.6)
    assert (costs.sleeps, [round(w, 3) for w in costs.wakes]) == ([3.0], [2.6])
    why = C.without_door(costs, 4.9)
    assert why is not None and "a sleep takes 3.0s here and a wake 2.6s" in why
    assert "4.9s for a reload" in why
    assert C.without_door(costs, 5.7) is None


def test_a_step_cut_short_measures_nothing() -> None:
    costs = C.Costs()
    costs.no_door(0.0, None)
    costs.ended()  # stopped before asleep
    costs.asleep(50.0)
    costs.resume_asked(60.0)
    costs.ended()  # the wake failed
    costs.ready(99.0)
    assert costs.sleeps == [] and costs.wakes == []
    assert costs.sleep_cost() == C.REPUBLISH and costs.wake_cost() == 0.0


def test_a_sleep_without_a_door_that_costs_more_than_a_reload_is_a_stop_saying_why() -> None:
    m, w = machine()
    up(m, w)
    w.want = L.Want.ASLEEP
    assert isinstance(m.step(w.look(m)), L.Deregister)
    m.deregistered(True)
    assert isinstance(m.step(w.look(m)), L.CheckLoad)
    m.load(w.now, EngineLoad(0))
    assert isinstance(m.step(w.look(m)), L.Pause)
    why = C.without_door(C.Costs(), 1.0)
    assert why is not None
    kill = m.paused(False, absent=True, why="HTTP 404", instead=why)
    assert isinstance(kill, L.Kill) and m.state == S.STOPPING and m.reason == why
    assert m.settle_want == L.Want.DOWN  # not put to sleep again by itself
    m.killed(w.now + 1)
    assert m.state == S.STOPPED and m.reason == why and not m.memory_released


durations = st.floats(0.0, 600.0, allow_nan=False)


@given(
    sleeps=st.lists(durations, max_size=8),
    wakes=st.lists(durations, max_size=8),
    reload=durations,
    more=st.floats(0.0, 600.0, allow_nan=False),
)
@budget(200)
def test_it_stops_only_when_the_sleep_and_wake_cost_at_least_the_reload(
    sleeps: list[float], wakes: list[float], reload: float, more: float
) -> None:
    costs = C.Costs()
    now = 0.0
    for took in sleeps:
        costs.no_door(now, None)
        costs.asleep(now + took)
        now += took + 1
    for took in wakes:
        costs.resume_asked(now)
        costs.ready(now + took)
        now += took + 1
    assert len(costs.sleeps) == min(len(sleeps), C.KEEP)
    # Until measured, a sleep costs at least the fence's zero readings, a wake nothing.
    assert costs.sleep_cost() >= (0.0 if sleeps else C.REPUBLISH)
    cost = costs.sleep_cost() + costs.wake_cost()
    stop = C.without_door(costs, reload)
    assert (stop is not None) == (cost >= reload)
    # Monotone in the reload: a slower reload never turns a sleep into a stop.
    if stop is None:
        assert C.without_door(costs, reload + more) is None
    else:
        assert C.without_door(costs, max(0.0, reload - more)) is not None
