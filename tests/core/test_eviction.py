"""Eviction and idle-TTL policy alone: a placement plan and holders in, a step out."""

from __future__ import annotations

from dataclasses import dataclass

from ktd.core import states as S
from ktd.core.eviction import (
    HolderView,
    NoLaunch,
    StopIdle,
    Use,
    WaitIdle,
    WaitLeaving,
    idle_for,
    place_step,
    waitable,
)


@dataclass(frozen=True)
class P:
    ok: bool = True
    evict: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    impossible: bool = False
    reason: str | None = None


def holder(alias: str, state: str = S.READY, *, want_up: bool = True, **kw: object) -> HolderView:
    return HolderView(alias=alias, state=state, want_up=want_up, **kw)  # type: ignore[arg-type]


def test_a_fitting_plan_is_used_or_evicts_the_idle_engines_it_names() -> None:
    assert place_step(P(), {}, swap=True) == Use()
    assert place_step(P(evict=("a", "b")), {}, swap=True) == StopIdle(("a", "b"))


def test_an_impossible_plan_is_refused_as_such() -> None:
    step = place_step(P(ok=False, impossible=True, reason="no NUMA node 7"), {}, swap=True)
    assert step == NoLaunch("no NUMA node 7", impossible=True)


def test_holders_already_leaving_are_waited_for() -> None:
    views = {"a": holder("a", S.DRAINING, want_up=False), "b": holder("b", in_flight=1)}
    step = place_step(P(ok=False, blocked_by=("a", "b")), views, swap=True)
    assert step == WaitLeaving(("a",))


def test_busy_holders_that_can_swap_are_waited_for_until_idle() -> None:
    views = {"a": holder("a", in_flight=2), "b": holder("b", S.STARTING)}
    step = place_step(P(ok=False, blocked_by=("a", "b"), reason="busy"), views, swap=True)
    assert step == WaitIdle(("a", "b"))


def test_pinned_holders_or_no_swap_make_it_busy() -> None:
    plan = P(ok=False, blocked_by=("a",), reason="a holds GPU 0")
    pinned = {"a": holder("a", in_flight=1, pinned=True)}
    assert place_step(plan, pinned, swap=True) == NoLaunch("a holds GPU 0", ("a",))
    assert place_step(plan, {"a": holder("a", in_flight=1)}, swap=False) == NoLaunch(
        "a holds GPU 0", ("a",)
    )


def test_blocked_by_no_known_engine_is_busy() -> None:
    assert place_step(P(ok=False, blocked_by=("ghost",)), {}, swap=True) == NoLaunch(
        "cannot be placed", ("ghost",)
    )


def test_waitable() -> None:
    assert waitable(holder("a", S.READY), swap=True)
    assert waitable(holder("a", S.STARTING), swap=True)
    assert not waitable(holder("a", S.DRAINING), swap=True)
    assert not waitable(holder("a", want_up=False), swap=True)
    assert not waitable(holder("a", pinned=True), swap=True)
    assert not waitable(holder("a"), swap=False)


def test_idle_for_counts_only_requests_before_the_cutoff() -> None:
    assert idle_for(holder("a", queue=(7, 9)), cutoff=5)
    assert not idle_for(holder("a", queue=(3,)), cutoff=5)
    assert not idle_for(holder("a", in_flight=1), cutoff=5)
    assert not idle_for(holder("a", S.STARTING), cutoff=5)
    assert idle_for(holder("a", S.STOPPED), cutoff=5)
    assert idle_for(holder("a", S.STARTING, want_up=False), cutoff=5)


def test_a_wake_needs_its_own_nodes_and_gpus_idle_holders_go_busy_ones_are_waited_for() -> None:
    from ktd.core.eviction import room_for
    from ktd.core.placement import Holding

    holders = [
        Holding("idle", (0,), ()),
        Holding("busy", (), (1,), in_flight=2),
        Holding("elsewhere", (1,), (2,)),
        Holding("pinned", (0,), (), pinned=True),
    ]
    plan = room_for((0,), (1,), holders)
    assert plan.evict == ("idle",) and plan.blocked_by == ("busy", "pinned") and not plan.ok
    assert "busy" in (plan.reason or "")
    assert room_for((3,), (), holders).ok
    views = {
        "busy": HolderView("busy", S.READY, want_up=True, in_flight=2),
        "pinned": HolderView("pinned", S.READY, want_up=True, pinned=True),
    }
    assert isinstance(place_step(plan, views, swap=True), NoLaunch)  # pinned: never waited for
    del views["pinned"]
    plan = room_for((0,), (1,), holders[:3])
    assert isinstance(place_step(plan, views, swap=True), WaitIdle)


def test_a_holder_that_is_waking_is_waited_for_like_one_loading() -> None:
    """Measured (bench/sleep.py): two sleep models swapping back and forth refused the
    wake of one while the other woke: 13 of 60 requests got 503 busy."""
    waking = HolderView("a", S.WAKING, want_up=True)
    assert waitable(waking, swap=True)
    assert not idle_for(waking, cutoff=10)


def test_requests_the_holders_own_gate_holds_back_do_not_keep_it_busy() -> None:
    """Tickets 6 and 8 wait behind an earlier swap's cut (5) on a's gate: a later swap
    (cut 9) finds a idle, instead of waiting for requests a serves only after it."""
    held = holder("a", queue=(3, 6, 8), held_from=5)
    assert not idle_for(held, cutoff=9)  # ticket 3 is before both cuts: a serves it
    assert idle_for(holder("a", queue=(6, 8), held_from=5), cutoff=9)
    assert not idle_for(holder("a", queue=(6, 8)), cutoff=9)  # no cut: a serves them


def test_a_holder_that_holds_no_room_any_more_is_idle_for_everyone() -> None:
    """Put to sleep and wanted again (its wake waits for room): nothing to wait for."""
    assert idle_for(holder("a", S.WAKING, in_flight=1, queue=(1,), holds=False), cutoff=5)


def test_an_idle_holder_already_leaving_is_waited_for_not_put_to_sleep() -> None:
    """A restart's stop of idle a: a placement waits for it to be off; evicting it put
    a to sleep, and the restart waited for a stop that never came."""
    leaving = {"a": holder("a", want_up=False), "b": holder("b")}
    assert place_step(P(evict=("a", "b")), leaving, swap=True) == WaitLeaving(("a",))
    assert place_step(P(evict=("b",)), leaving, swap=True) == StopIdle(("b",))
