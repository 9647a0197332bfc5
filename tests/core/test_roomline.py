"""The room line alone: placements that need room take turns in arrival order, and wait
only for earlier ones that want the same engines' room (``ktd.core.roomline``)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ktd.core.eviction import NoLaunch, Step, StopIdle, Use, WaitIdle, WaitLeaving, WaitTurn
from ktd.core.roomline import RoomLine
from tests.hypo import budget

AWAKE = frozenset({"x", "y"})


def test_a_placement_that_needs_no_room_passes_and_does_not_join() -> None:
    line = RoomLine()
    assert line.step("a", Use(), AWAKE) == Use()
    assert line.line == []


def test_a_later_placement_waits_its_turn_for_an_engine_an_earlier_one_waits_for() -> None:
    """b would put x to sleep the moment it went idle, before a (which waited first)."""
    line = RoomLine()
    assert line.step("a", WaitIdle(("x",)), AWAKE) == WaitIdle(("x",))
    assert line.step("b", StopIdle(("x",)), AWAKE) == WaitTurn(("a",))
    assert line.step("c", WaitIdle(("x",)), AWAKE) == WaitTurn(("a", "b"))
    assert line.step("a", StopIdle(("x",)), AWAKE) == StopIdle(("x",))  # a's turn
    assert line.step("a", Use(), AWAKE - {"x"}) == Use()
    assert [w.who for w in line.line] == ["b", "c"]  # in arrival order
    # x is asleep and a holds the room now: b waits for a, and c behind b (before b
    # has planned again, the room b waited for is b's to take first).
    assert line.step("c", WaitIdle(("a",)), {"a"}) == WaitTurn(("b",))
    assert line.step("b", WaitIdle(("a",)), {"a"}) == WaitIdle(("a",))
    assert line.step("c", WaitIdle(("a",)), {"a"}) == WaitTurn(("b",))


def test_placements_that_want_other_engines_room_do_not_wait_for_each_other() -> None:
    line = RoomLine()
    assert line.step("a", WaitIdle(("x",)), AWAKE) == WaitIdle(("x",))
    assert line.step("b", StopIdle(("y",)), AWAKE) == StopIdle(("y",))
    assert line.step("b", Use(), AWAKE - {"y"}) == Use()


def test_room_an_earlier_placement_waited_for_is_its_to_take_first() -> None:
    """x went to sleep while a waited for it: b, whose plan needs no room now, waits
    until a has planned again; then a takes it and b goes on."""
    line = RoomLine()
    line.step("a", WaitIdle(("x",)), AWAKE)
    assert line.step("b", Use(), {"y"}) == WaitTurn(("a",))
    assert line.step("a", Use(), {"y"}) == Use()
    assert line.step("b", WaitIdle(("a",)), {"a", "y"}) == WaitIdle(("a",))


def test_a_refusal_or_an_ended_placement_leaves_the_line() -> None:
    line = RoomLine()
    line.step("a", WaitIdle(("x",)), AWAKE)
    line.step("b", WaitIdle(("x",)), AWAKE)
    assert line.step("b", NoLaunch("busy", ("x",)), AWAKE) == NoLaunch("busy", ("x",))
    line.leave("a")
    assert line.line == []


ENGINES = ("a", "b", "c", "d")
HOLDERS = ("x", "y", "z")


class LineMachine(RuleBasedStateMachine):
    """Steps of any placement in any order, and holders that come and go. After each:
    the line keeps arrival order, a placement waits only for earlier ones, and only
    for those that wait on an engine it names or on room freed since; the head never
    waits its turn."""

    def __init__(self) -> None:
        super().__init__()
        self.line = RoomLine()
        self.awake: set[str] = set(HOLDERS)
        self.joined: dict[str, int] = {}  # when each one in the line joined
        self.clock = 0

    @rule(
        who=st.sampled_from(ENGINES),
        kind=st.sampled_from([Use, StopIdle, WaitLeaving, WaitIdle, NoLaunch]),
        named=st.sets(st.sampled_from(HOLDERS), min_size=1, max_size=2),
    )
    def step(self, who: str, kind: type, named: set[str]) -> None:
        aliases = tuple(sorted(named & self.awake)) or tuple(sorted(named))
        given: Step = (
            Use() if kind is Use else NoLaunch("busy") if kind is NoLaunch else kind(aliases)
        )
        before = [(w.who, w.waits) for w in self.line.line]
        at = next((i for i, (w, _) in enumerate(before) if w == who), len(before))
        out = self.line.step(who, given, frozenset(self.awake))
        self.clock += 1
        if isinstance(out, WaitTurn):
            assert at > 0, "the head never waits its turn"
            earlier = dict(before[:at])
            mine = set(aliases) if not isinstance(given, Use) else set()
            for ahead in out.ahead:
                assert ahead in earlier, f"{who} waits for {ahead}, not ahead of it"
                waits = earlier[ahead]
                assert waits & mine or waits - self.awake, f"{ahead} wants no room of {who}'s"
        else:
            assert out == given
        if isinstance(out, (Use, NoLaunch)):
            self.joined.pop(who, None)
        else:
            self.joined.setdefault(who, self.clock)

    @rule(who=st.sampled_from(ENGINES))
    def placement_ends(self, who: str) -> None:
        self.line.leave(who)
        self.joined.pop(who, None)

    @rule(alias=st.sampled_from(HOLDERS))
    def holder_comes_or_goes(self, alias: str) -> None:
        self.awake ^= {alias}

    @invariant()
    def in_arrival_order_once_each(self) -> None:
        order = [w.who for w in self.line.line]
        assert order == sorted(self.joined, key=self.joined.__getitem__), order


TestLine = LineMachine.TestCase
TestLine.settings = budget(100, stateful_step_count=30, deadline=None)
