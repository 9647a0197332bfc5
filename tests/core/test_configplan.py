"""The plan of a config change, alone: the running and the new config, the engines'
views and the gathered facts in, a plan out; and the rule for a change while a load or
a swap is under way (issue 39)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from ktd import protocol as p
from ktd.core import states as S
from ktd.core.config import Config
from ktd.core.configload import ConfigTexts, parse_config
from ktd.core.configplan import (
    DISTURBING,
    Moving,
    SpecFacts,
    field_path,
    in_motion,
    plan_change,
    refusals,
)
from ktd.core.reload import Existing
from tests.hypo import budget


def config(
    models: list[dict[str, Any]], *, section: dict[str, Any] | None = None, **sections: Any
) -> Config:
    doc = {"ktransformers": section or {}, "models_file": "models.json", **sections}
    texts = ConfigTexts(
        "/etc/ktd/config.json",
        json.dumps(doc).encode(),
        "/etc/ktd/models.json",
        json.dumps(models).encode(),
        True,
    )
    return parse_config(texts)


def entry(alias: str, **kw: Any) -> dict[str, Any]:
    return {"path": f"/m/{alias}", "backend": "kt", "alias": alias, **kw}


def views(cfg: Config, **states: Any) -> dict[str, Existing]:
    """Each served model of ``cfg`` as an engine: ``alias=state``, ``alias=(state, in_flight)``."""
    out = {}
    for spec in cfg.served():
        got = states.get(spec.alias, S.STOPPED)
        state, flying = got if isinstance(got, tuple) else (got, 0)
        out[spec.alias] = Existing(spec=spec, state=state, in_flight=flying)
    return out


def plan_of(
    old: Config,
    new: Config,
    facts: dict[str, SpecFacts] | None = None,
    motion: dict[str, str] | None = None,
    sleeps: dict[str, bool] | None = None,
    **states: Any,
) -> p.ConfigPlanView:
    return plan_change(
        old,
        new,
        views(old, **states),
        facts or {},
        motion=motion,
        sleeps=sleeps,
        base="aaa",
        version="bbb",
        running="aaa",
    )


def actions(plan: p.ConfigPlanView) -> dict[str, tuple[str, list[str]]]:
    return {e.alias: (e.action, [f.field for f in e.fields]) for e in plan.engines}


OLD = config([entry("a", kt={"ctx": 4096}), entry("b", ttl=600), entry("q", backend="ds4")])


def test_each_engine_says_what_happens_and_which_field_made_it() -> None:
    new = config(
        [
            entry("a", kt={"ctx": 8192}),  # launch changed
            entry("b", ttl=30),  # live
            entry("c"),  # new
        ]
    )
    plan = plan_of(OLD, new, a=S.READY, b=S.READY)
    assert actions(plan) == {
        "a": ("restart", ["kt.ctx"]),
        "b": ("update", ["ttl"]),
        "c": ("add", []),
        "q": ("remove", []),
    }
    a = next(e for e in plan.engines if e.alias == "a")
    assert (a.fields[0].old, a.fields[0].new, a.state) == (4096, 8192, "ready")
    assert plan.ok and plan.summary == "restart: a (kt.ctx); add: c; remove: q; update: b (ttl)"


def test_what_a_restart_means_depends_on_the_engine() -> None:
    new = config(
        [entry("a", kt={"ctx": 1}), entry("b", ttl=600, kt={"ctx": 1}), entry("q", backend="ds4")]
    )
    # Stopped: the new launch is simply the next one.
    assert actions(plan_of(OLD, new))["a"] == ("update", ["kt.ctx"])
    # Serving requests: it restarts once they have ended; asleep: stopped now.
    plan = plan_of(OLD, new, a=(S.READY, 3), b=S.ASLEEP)
    by = {e.alias: e for e in plan.engines}
    assert (by["a"].action, by["b"].action) == ("restart", "stop")
    assert "3 request(s) in flight" in by["a"].note
    assert "asleep" in by["b"].note


def test_a_removed_running_engine_is_stopped() -> None:
    plan = plan_of(OLD, config([entry("b", ttl=600)]), a=S.READY)
    assert actions(plan)["a"] == ("stop", [])


def test_fields_are_named_where_they_are_set() -> None:
    old = config([entry("a"), entry("b", kt={"ctx": 5})], section={"ctx": 100})
    new = config([entry("a"), entry("b", kt={"ctx": 5})], section={"ctx": 200})
    # a takes the section's ctx, b sets its own (and keeps it).
    assert actions(plan_of(old, new, a=S.READY, b=S.READY)) == {
        "a": ("restart", ["ktransformers.ctx"]),
        "b": ("unchanged", []),
    }
    spec = new.models["b"]
    assert field_path(new, spec, "ctx") == ("/etc/ktd/models.json", "$[1].kt.ctx", "kt.ctx")
    assert field_path(new, new.models["a"], "extra_args")[1:] == (
        "$.ktransformers.extra_args",
        "ktransformers.extra_args",
    )


def test_settings_say_when_they_take_effect_and_never_show_a_secret() -> None:
    old = config([entry("a")], daemon={"drain_timeout": 60}, frontend={"api_keys": ["sk-old"]})
    new = config(
        [entry("a")],
        daemon={"drain_timeout": 30, "lease_ttl": 20},
        frontend={"api_keys": ["sk-new"]},
    )
    plan = plan_of(old, new)
    got = {s.field: (s.old, s.new, s.effect) for s in plan.settings}
    assert got["daemon.drain_timeout"] == (60.0, 30.0, "now")
    assert got["daemon.lease_ttl"][2] == "at ktd's restart"
    assert got["frontend.api_keys"][:2] == ("(hidden)", "(changed)")
    assert "sk-" not in json.dumps(msgspec_builtins(plan))


def msgspec_builtins(obj: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(obj)


def test_facts_become_problems_naming_the_file_and_field() -> None:
    new = config([entry("a", kt={"ctx": 8192, "extra_args": ["--nope"]}), entry("b", ttl=600)])
    facts = {
        "a": SpecFacts(
            refused_flags="extra_args --nope: not an option of sglang-kt 0.7.2",
            missing=(("kt_weight_path", "kt_weight_path /w does not exist"),),
            fit="NUMA node 0 needs 300 GiB RAM, has 10 GiB free",
        )
    }
    plan = plan_of(OLD, new, facts)
    got = [(q.level, q.path, q.message[:25]) for q in plan.problems]
    assert got == [
        ("error", "$[0].kt.extra_args", "extra_args --nope: not an"),
        ("error", "$.ktransformers.kt_weight_path", "kt_weight_path /w does no"),
        ("warning", "", "a would not fit now: NUMA"),
    ]
    assert plan.problems[0].file == "/etc/ktd/models.json" and not plan.ok


def test_a_restart_placed_now_puts_to_sleep_or_stops_what_is_in_its_way() -> None:
    old = config([entry("a", numa=[0]), entry("b", numa=[1]), entry("c", numa=[1])])
    new = config([entry("a", numa=[1]), entry("b", numa=[1]), entry("c", numa=[1])])
    facts = {"a": SpecFacts(evicts=("b", "c"), waits_for=())}
    plan = plan_of(old, new, facts, sleeps={"b": True}, a=S.READY, b=S.READY, c=S.READY)
    by = {e.alias: e for e in plan.engines}
    assert (by["a"].action, by["b"].action, by["c"].action) == ("restart", "sleep", "stop")
    assert "when a restarts" in by["b"].note


def test_a_hand_edit_not_reloaded_is_part_of_the_plan_and_said() -> None:
    plan = plan_change(OLD, OLD, views(OLD), {}, base="disk", version="disk", running="ktd")
    assert [q.level for q in plan.problems] == ["warning"] and "by hand" in plan.problems[0].message


# ---------------------------------------------------------------- the rule: loads and swaps


def test_loading_waking_and_sleeping_engines_and_swap_holders_are_in_motion() -> None:
    got = in_motion(
        [
            Moving("a", S.STARTING, "loading"),
            Moving("b", S.READY),
            Moving("c", S.STARTING, "waiting", ("b",)),
            Moving("d", S.WAKING, "making_room", ("e",)),
            Moving("e", S.DRAINING, "draining"),
            Moving("f", S.SLEEPING, "releasing"),
            Moving("g", S.ASLEEP),
        ]
    )
    assert got == {
        "a": "loading (loading)",
        "b": "part of c's swap (c is waiting)",
        "c": "loading (waiting)",
        "d": "waking",
        "e": "part of d's swap (d is making_room)",
        "f": "going to sleep",
    }


def test_a_change_that_would_throw_a_load_away_is_refused_and_the_rest_goes() -> None:
    new = config([entry("a", kt={"ctx": 8192}), entry("b", ttl=30), entry("q", backend="ds4")])
    motion = {"a": "loading (loading)", "b": "loading (loading)"}
    plan = plan_of(OLD, new, motion=motion, a=S.STARTING, b=S.STARTING)
    assert not plan.ok
    assert [(q.alias, q.code) for q in plan.problems] == [("a", "busy")]  # b: only its ttl
    assert (
        "a is loading (loading): this change would restart it (kt.ctx)" in plan.problems[0].message
    )


_ACTIONS = ["unchanged", "update", "restart", "stop", "sleep", "add", "remove", "start"]


@budget(300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_ACTIONS), st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_the_rule_refuses_exactly_what_disturbs_an_engine_in_motion(
    engines: list[tuple[str, bool]],
) -> None:
    plans = [p.EnginePlan(alias=f"m{i}", action=a) for i, (a, _) in enumerate(engines)]
    motion = {f"m{i}": "loading" for i, (_, moving) in enumerate(engines) if moving}
    refused = {q.alias for q in refusals(plans, motion)}
    assert refused == {e.alias for e in plans if e.alias in motion and e.action in DISTURBING}
    assert all(q.level == "error" and q.code == "busy" for q in refusals(plans, motion))


class ChangesWhileEnginesMove(RuleBasedStateMachine):
    """Engines load, wait for a swap, make room, sleep and wake; changes are tried at
    every step. A change is refused exactly when it would restart, stop or put to sleep
    an engine that is loading, waking, going to sleep, or waited for or stopped by
    another one's load (an oracle stated on the model, apart from ``in_motion``)."""

    ALIASES = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.engines = {a: Moving(a, S.STOPPED) for a in self.ALIASES}

    def _set(
        self, alias: str, state: str, step: str | None = None, engines: tuple[str, ...] = ()
    ) -> None:
        self.engines[alias] = Moving(alias, state, step, engines)

    @rule(alias=st.sampled_from(ALIASES))
    def load(self, alias: str) -> None:
        self._set(alias, S.STARTING, "loading")

    @rule(alias=st.sampled_from(ALIASES), holder=st.sampled_from(ALIASES))
    def wait_for(self, alias: str, holder: str) -> None:
        if holder != alias:
            self._set(alias, S.STARTING, "waiting", (holder,))

    @rule(alias=st.sampled_from(ALIASES), victim=st.sampled_from(ALIASES))
    def make_room(self, alias: str, victim: str) -> None:
        if victim != alias:
            self._set(alias, S.WAKING, "making_room", (victim,))
            self._set(victim, S.DRAINING, "draining")

    @rule(
        alias=st.sampled_from(ALIASES),
        state=st.sampled_from(
            [S.READY, S.SLEEPING, S.ASLEEP, S.WAKING, S.STOPPED, S.DRAINING, S.STOPPING]
        ),
    )
    def move(self, alias: str, state: str) -> None:
        self._set(alias, state)

    @rule(actions=st.lists(st.sampled_from(_ACTIONS), min_size=3, max_size=3))
    def change(self, actions: list[str]) -> None:
        plans = [
            p.EnginePlan(alias=a, action=act) for a, act in zip(self.ALIASES, actions, strict=True)
        ]
        refused = {q.alias for q in refusals(plans, in_motion(list(self.engines.values())))}
        busy = {a for a, m in self.engines.items() if m.state in (S.STARTING, S.WAKING, S.SLEEPING)}
        for m in self.engines.values():
            if m.state in (S.STARTING, S.WAKING) and m.step in ("waiting", "making_room"):
                busy |= set(m.engines)
        assert refused == {e.alias for e in plans if e.alias in busy and e.action in DISTURBING}
        # What is refused is said as busy, naming the engine; nothing else is touched.
        assert all(
            q.code == "busy" and q.alias in q.message
            for q in refusals(plans, in_motion(list(self.engines.values())))
        )


ChangesWhileEnginesMove.TestCase.settings = budget(60, stateful_step_count=30, deadline=None)
test_changes_while_engines_move = ChangesWhileEnginesMove.TestCase


def test_a_value_taken_out_of_an_entry_is_named_as_the_entrys() -> None:
    old = config([entry("a", kt={"ctx": 8192})], section={"ctx": 100})
    new = config([entry("a")], section={"ctx": 100})
    assert actions(plan_of(old, new, a=S.READY))["a"] == ("restart", ["kt.ctx"])


# A changed value of each launch field, as the files hold it: (entry's fields, section's).
_LAUNCH_CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "path": ({"path": "/m/elsewhere"}, {}),
    "kt_weight_path": ({"kt": {"kt_weight_path": "/w/a"}}, {}),
    "host": ({}, {"host": "127.0.0.2"}),
    "port": ({"kt": {"port": 8001}}, {}),
    "ctx": ({"kt": {"ctx": 8192}}, {}),
    "extra_args": ({"kt": {"extra_args": ["--x"]}}, {}),
    "extra_env": ({"kt": {"extra_env": {"A": "1"}}}, {}),
    "python": ({"kt": {"python": "/venv/bin/python"}}, {}),
    "tp_size": ({"kt": {"tp_size": 2}}, {}),
    "numa": ({"numa": [0]}, {}),
    "gpus": ({"gpus": [0]}, {}),
    "sleep": ({"sleep": True}, {}),
}


def test_the_plan_names_every_launch_field_that_changed() -> None:
    """Issue 45: the plan's field names are read off the table of fields, so a launch
    field cannot restart an engine in a plan that names no field. Every launch field a
    served model can change is here (the multi-node ones are refused for kt)."""
    from ktd.core.modelfields import LAUNCH

    assert set(_LAUNCH_CHANGES) == LAUNCH - {"nnodes", "dist_init_addr"}
    old = config([entry("a")])
    for name, (own, section) in _LAUNCH_CHANGES.items():
        new = config([{**entry("a"), **own}], section=section)
        got = actions(plan_of(old, new, a=S.READY))["a"]
        assert got[0] == "restart" and len(got[1]) == 1, (name, got)
        label = got[1][0]
        assert label.removeprefix("kt.").removeprefix("ktransformers.") == name, (name, got)
