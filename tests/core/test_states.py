"""The engine state machine's legal moves."""

from __future__ import annotations

import itertools

import pytest

from ktd.core import states as S


def test_lifecycle_path_is_legal() -> None:
    path = [S.STOPPED, S.STARTING, S.READY, S.DRAINING, S.STOPPING, S.STOPPED]
    for a, b in itertools.pairwise(path):
        S.check(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.STOPPED, S.READY),
        (S.STOPPED, S.DRAINING),
        (S.DRAINING, S.READY),
        (S.FAILED, S.READY),
        (S.STOPPING, S.READY),
        (S.DRAINING, S.STARTING),
    ],
)
def test_illegal_moves_raise(a: str, b: str) -> None:
    with pytest.raises(S.IllegalTransition):
        S.check(a, b)


def test_every_state_has_a_way_back_to_stopped() -> None:
    for state in S.ALL:
        seen, todo = {state}, [state]
        while todo:
            for nxt in S.TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert S.STOPPED in seen or state == S.STOPPED


def test_making_room_says_who_sleeps_and_who_stops() -> None:
    """Issue 43: every victim of a swap was "stopping", the ones put to sleep too."""
    from ktd.core.states import making_room

    assert making_room(("b",)) == "stopping b to make room"
    assert making_room((), ("a",)) == "putting a to sleep to make room"
    assert making_room(("b", "c"), ("a",)) == "putting a to sleep and stopping b, c to make room"
