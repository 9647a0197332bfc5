"""The room line (pure): placements that need room take turns, in arrival order.

Why: with engines that do not fit together, every placement that needs room (a load,
a wake) evicts or waits for whatever holds it. Left to race, each one that found its
holder idle first took the room, so the engines took turns putting each other to
sleep and the placement that had waited longest could lose every race (a model's
requests waited past any bound). Here a placement joins the line the first time it
needs room, and a later one may not act on an engine an earlier one waits for: it
waits its turn (``eviction.WaitTurn``) and plans again when the line moves.

The line holds only on engines currently waited for: what each placement waits on is
what its last step named, and only while that engine holds its room (its awake
period). Once such an engine stops holding, the room it freed is the earlier
placement's to take first, so a later one waits even for a plan that needs no room
until the earlier one has planned again. Placements that want other engines' room
never wait for each other. The head of the line never waits its turn, and every
other one waits only for earlier ones, so the line always moves.

``ktd.daemon.pool.placer`` feeds it each step ``eviction.place_step`` answers and
carries out what it returns.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from ktd.core.eviction import NoLaunch, Step, StopIdle, Use, WaitIdle, WaitLeaving, WaitTurn

__all__ = ["RoomLine", "Waiting"]


@dataclass
class Waiting:
    """One placement in the line: its engine, and the engines whose room it waits for."""

    who: str
    waits: frozenset[str] = field(default_factory=frozenset)


class RoomLine:
    """The placements that need room, in arrival order (``line[0]`` came first)."""

    def __init__(self) -> None:
        self.line: list[Waiting] = []

    def position(self, who: str) -> int | None:
        return next((i for i, w in enumerate(self.line) if w.who == who), None)

    def step(self, who: str, step: Step, holding: Set[str]) -> Step:
        """The step ``who`` takes now: ``step`` (``place_step``'s answer for its plan),
        or ``WaitTurn`` behind earlier placements. ``holding``: the engines that hold
        their room now."""
        if isinstance(step, (WaitTurn, NoLaunch)):
            if isinstance(step, NoLaunch):  # refused as things stand: no turn to wait
                self.leave(who)
            return step
        at = self.position(who)
        ahead = self.line if at is None else self.line[:at]
        named = frozenset(_named(step))
        blocking = tuple(
            w.who for w in ahead if w.waits & named or any(a not in holding for a in w.waits)
        )
        if isinstance(step, Use) and not blocking:
            self.leave(who)
            return step
        if at is None:
            self.line.append(Waiting(who))
            at = len(self.line) - 1
        if named:
            self.line[at].waits = named
        return WaitTurn(blocking) if blocking else step

    def leave(self, who: str) -> None:
        """``who``'s placement ended (placed, refused, called off)."""
        self.line = [w for w in self.line if w.who != who]


def _named(step: Step) -> tuple[str, ...]:
    """The engines a step acts on or waits for."""
    if isinstance(step, (StopIdle, WaitLeaving, WaitIdle)):
        return step.aliases
    return ()
