"""The reload diff alone: engines as they are and a new config in, a plan out."""

from __future__ import annotations

from typing import Any

from ktd.core import states as S
from ktd.core.config import ModelSpec
from ktd.core.reload import Existing, plan_reload


def spec(alias: str, **kw: Any) -> ModelSpec:
    return ModelSpec(alias=alias, backend="kt", path=f"/m/{alias}", served=True, source="t", **kw)


def kinds(engines: dict[str, Existing], served: list[ModelSpec]) -> dict[str, str]:
    plan = plan_reload(engines, {s.alias: s for s in served})
    return {c.alias: c.kind for c in plan.changes}


def test_nothing_changed() -> None:
    a = spec("a")
    plan = plan_reload({"a": Existing(a, S.READY)}, {"a": a})
    assert [c.kind for c in plan.changes] == ["same"]
    assert plan.summary() == "no changes"


def test_added_and_removed() -> None:
    plan = plan_reload({"old": Existing(spec("old"), S.READY)}, {"new": spec("new")})
    assert [(c.alias, c.kind) for c in plan.changes] == [("old", "remove"), ("new", "add")]
    assert plan.summary() == "added: new; removed: old"


def test_lifecycle_fields_update_in_place_without_a_restart() -> None:
    running = Existing(spec("a"), S.READY, in_flight=2)
    assert kinds({"a": running}, [spec("a", ttl=60.0, pinned=True)]) == {"a": "update"}


def test_a_changed_launch_of_a_stopped_engine_just_takes_the_new_spec() -> None:
    stopped = Existing(spec("a"), S.STOPPED)
    assert kinds({"a": stopped}, [spec("a", ctx=8192)]) == {"a": "update"}


def test_a_changed_launch_restarts_when_idle_or_is_stale_while_busy() -> None:
    new = spec("a", ctx=8192)
    plan = plan_reload({"a": Existing(spec("a"), S.READY)}, {"a": new})
    (change,) = plan.changes
    assert (change.kind, change.spec, change.schedule_restart) == ("restart", new, True)
    assert plan.summary() == "restarting: a"
    busy = plan_reload({"a": Existing(spec("a"), S.READY, in_flight=1)}, {"a": new})
    assert busy.changes[0].kind == "stale"
    assert busy.summary() == "stale until idle: a"


def test_a_second_reload_does_not_schedule_a_second_restart() -> None:
    view = Existing(spec("a"), S.READY, restart_pending=True)
    (change,) = plan_reload({"a": view}, {"a": spec("a", ctx=4096)}).changes
    assert change.kind == "restart" and not change.schedule_restart


def test_back_to_the_running_spec_cancels_the_pending_restart() -> None:
    view = Existing(spec("a"), S.READY, restart_pending=True)
    assert kinds({"a": view}, [spec("a")]) == {"a": "same"}


def test_removed_then_back_before_it_stopped_is_revived_else_replaced() -> None:
    leaving = Existing(spec("a"), S.DRAINING, retired=True)
    gone = Existing(spec("a"), S.STOPPED, retired=True, finished=True)
    assert kinds({"a": leaving}, [spec("a")]) == {"a": "revive"}
    assert kinds({"a": gone}, [spec("a")]) == {"a": "replace"}
    assert plan_reload({"a": gone}, {"a": spec("a")}).summary() == "added: a"


def test_summary_lists_every_kind_in_a_fixed_order() -> None:
    engines = {
        "r": Existing(spec("r"), S.READY),
        "s": Existing(spec("s"), S.READY, in_flight=1),
        "u": Existing(spec("u"), S.READY),
        "x": Existing(spec("x"), S.READY),
    }
    served = [spec("r", ctx=1), spec("s", ctx=1), spec("u", ttl=5.0), spec("n")]
    assert plan_reload(engines, {s.alias: s for s in served}).summary() == (
        "added: n; removed: x; restarting: r; stale until idle: s; updated in place: u"
    )


def test_a_changed_launch_of_an_asleep_engine_restarts_it() -> None:
    """Its process lives (asleep): a wake would resume the old launch."""
    plan = plan_reload({"a": Existing(spec("a"), S.ASLEEP)}, {"a": spec("a", ctx=999)})
    assert [(c.alias, c.kind) for c in plan.changes] == [("a", "restart")]
