"""The daemon's gate alone (``ktd.core.gate``): swaps' cuts. (The gate's other rules are
tested with the desk's in ``tests/core/test_admission.py``.)"""

from __future__ import annotations

from ktd.core import states as S
from ktd.core.gate import Answer, EngineView, Gate, GateWaiter, WaitEnd, WantUp
from ktd.core.limits import QueueLimits

READY = EngineView(state=S.READY, want_up=True)


def granted(actions: list[object]) -> list[int]:
    return [a.ticket for a in actions if isinstance(a, Answer) and a.outcome == WaitEnd.GRANTED]


def test_two_overlapping_swaps_keep_a_cut_each_and_the_earliest_is_in_force() -> None:
    """Swap 1 cuts at 5, swap 2 at 9. Swap 2's cut does not move swap 1's; swap 1's end
    leaves swap 2's in force (one cut for all: swap 1's end lifted it, and the requests
    swap 2 waited behind were served before it)."""
    g, lim = Gate(), QueueLimits()
    assert g.hold_back(5) and not g.hold_back(9)
    for t in (3, 6, 10):
        g.arrive(GateWaiter(t), READY, lim, now=0)
    assert g.cutoff == 5 and granted(g.update(READY, lim, now=0)) == []  # 3 passed at once
    g.release(5)
    assert g.cutoff == 9 and granted(g.update(READY, lim, now=1)) == [6]
    g.release(9)
    assert g.cutoff is None and granted(g.update(READY, lim, now=2)) == [10]


def test_the_later_swap_ending_first_leaves_the_earlier_cut_in_force() -> None:
    g, lim = Gate(), QueueLimits()
    g.hold_back(5)
    g.hold_back(9)
    g.arrive(GateWaiter(6), READY, lim, now=0)
    g.release(9)
    assert g.cutoff == 5 and granted(g.update(READY, lim, now=1)) == []
    g.release(5)
    g.release(5)  # a cut ends once; again is nothing
    assert g.cutoff is None and granted(g.update(READY, lim, now=2)) == [6]


def test_a_request_for_an_asleep_engine_that_is_being_stopped_loads_it_after_the_stop() -> None:
    """A stop (a restart's) of an asleep engine: a request does not wake it (calling the
    stop off); it waits, and the stopped engine is loaded for it."""
    g, lim = Gate(), QueueLimits()
    stopping = EngineView(state=S.ASLEEP, want_up=False, stopping=True)
    assert g.arrive(GateWaiter(1), stopping, lim, now=0) == []
    assert g.update(EngineView(state=S.STOPPING, want_up=False), lim, now=1) == []
    assert g.update(EngineView(state=S.STOPPED, want_up=False), lim, now=2) == [WantUp()]
