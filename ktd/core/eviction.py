"""Swaps (pure): what a launch does about the engines in its way, and what a failed
one brings back.

``place_step`` reads a placement plan and the holders it names and answers one
of: use the plan, evict these idle engines, wait for engines already leaving,
wait for busy holders to go idle (they yield meanwhile: ``ktd.core.admission``'s
cutoff), or refuse (busy, or impossible on this machine). ``ktd.daemon.pool.placer``
carries the answer out. A launch that stopped engines to make room and then
failed before it was ready brings back those that still fit (``bring_back``):
a crash of the new model must not leave the box serving nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ktd.core import states as S
from ktd.core.action import MachineAction
from ktd.core.placement import Holding

__all__ = [
    "HolderView",
    "NoLaunch",
    "PlanView",
    "Step",
    "StopIdle",
    "Use",
    "WaitIdle",
    "WaitLeaving",
    "WaitTurn",
    "bring_back",
    "idle_for",
    "place_step",
    "room_for",
    "waitable",
]


class PlanView(Protocol):
    """What ``place_step`` reads of a placement plan (``ktd.core.placement.Plan``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def evict(self) -> tuple[str, ...]: ...
    @property
    def blocked_by(self) -> tuple[str, ...]: ...
    @property
    def impossible(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...


@dataclass(frozen=True)
class HolderView:
    """What the decision reads of an engine holding resources."""

    alias: str
    state: str
    want_up: bool
    pinned: bool = False
    in_flight: int = 0
    queue: tuple[int, ...] = ()  # tickets of waiting requests
    held_from: int | None = None  # its own gate's cut in force: tickets from it wait
    holds: bool = True  # holds its NUMA nodes and GPUs now (``states.holds``)


class Use(MachineAction):
    """The plan fits as it is: launch."""


class StopIdle(MachineAction):
    """Stop these idle engines, wait for them, then plan again."""

    aliases: tuple[str, ...]


class WaitLeaving(MachineAction):
    """These holders are already on their way down: wait for them, then plan again."""

    aliases: tuple[str, ...]


class WaitIdle(MachineAction):
    """These busy holders will be evictable once idle: they yield, the launch waits."""

    aliases: tuple[str, ...]


class NoLaunch(MachineAction):
    """No launch now: ``impossible`` = never on this machine (a config error), else busy."""

    reason: str
    blocked_by: tuple[str, ...] = ()
    impossible: bool = False


class WaitTurn(MachineAction):
    """Placements that came earlier wait for these engines' room: wait for them to be
    placed (``ktd.core.roomline``), then plan again."""

    ahead: tuple[str, ...]


Step = Use | StopIdle | WaitLeaving | WaitIdle | NoLaunch | WaitTurn


def waitable(holder: HolderView, *, swap: bool) -> bool:
    """Will ``holder`` become evictable, for a launch allowed to ``swap``, just by
    finishing its work?"""
    # Waking is a load in seconds: waited for like one (a wake refused while the other
    # side wakes made every second request of a ping-pong busy).
    awake = (S.READY, S.STARTING, S.WAKING)
    return swap and holder.want_up and not holder.pinned and holder.state in awake


def idle_for(holder: HolderView, cutoff: int) -> bool:
    """Done with everything that arrived before ``cutoff`` (or gone: holding nothing).

    Requests its own gate holds back (from ``held_from``: it yields to an earlier swap)
    do not count: they wait for that swap, not for this engine, and counting them kept
    a later swap waiting for requests that could not be served until it was done."""
    if holder.state in (S.STOPPED, S.FAILED) or not holder.want_up or not holder.holds:
        return True
    if holder.state != S.READY or holder.in_flight:
        return False
    held = holder.held_from
    return not any(t < cutoff and (held is None or t < held) for t in holder.queue)


def place_step(plan: PlanView, holders: Mapping[str, HolderView], *, swap: bool) -> Step:
    """What to do with ``plan``; ``holders`` has every engine the plan names (those it
    evicts and those it is blocked by)."""
    if plan.ok:
        # Idle holders already on their way down (a restart's or a user's stop) are
        # waited for, not put to sleep: evicting one turned a restart's stop into a sleep.
        going = tuple(a for a in plan.evict if a in holders and not holders[a].want_up)
        if going:
            return WaitLeaving(going)
        return StopIdle(tuple(plan.evict)) if plan.evict else Use()
    reason = plan.reason or "cannot be placed"
    if plan.impossible:
        return NoLaunch(reason, impossible=True)
    blocking = [holders[a] for a in plan.blocked_by if a in holders]
    leaving = tuple(h.alias for h in blocking if not h.want_up)
    if leaving:  # already being evicted: wait for them rather than fail
        return WaitLeaving(leaving)
    if not blocking or not all(waitable(h, swap=swap) for h in blocking):
        return NoLaunch(reason, tuple(plan.blocked_by))
    return WaitIdle(tuple(h.alias for h in blocking))


def bring_back(
    made_room: tuple[str, ...], *, stopped: Mapping[str, bool], fits: Mapping[str, bool]
) -> tuple[str, ...]:
    """Of the engines a failed launch stopped to make room, those to start again: still
    stopped and unwanted (nobody loaded or evicted them since), and placeable now
    without stopping anything."""
    return tuple(a for a in made_room if stopped.get(a, False) and fits.get(a, False))


@dataclass(frozen=True)
class RoomPlan:
    """A wake's plan (a ``PlanView``): the asleep process is pinned to its own NUMA nodes
    and GPUs, so it wakes there or not at all. Awake holders in the way that are idle
    are made room of at once (``evict``: put to sleep or stopped); busy ones are
    waited for, or refuse the wake (``blocked_by``, judged by ``place_step``)."""

    evict: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    impossible: bool = False

    @property
    def ok(self) -> bool:
        return not self.blocked_by

    @property
    def reason(self) -> str | None:
        if not self.blocked_by:
            return None
        return f"its NUMA nodes or GPUs are held by {', '.join(self.blocked_by)}"


def room_for(
    numa_nodes: Sequence[int], gpus: Sequence[int], holders: Sequence[Holding]
) -> RoomPlan:
    """Who is in the way of waking an engine on ``numa_nodes`` and ``gpus``."""
    nodes, cards = set(numa_nodes), set(gpus)
    evict: list[str] = []
    blocked: list[str] = []
    for h in holders:
        if not (nodes & set(h.numa_nodes) or cards & set(h.gpus)):
            continue
        (evict if h.evictable else blocked).append(h.alias)
    return RoomPlan(tuple(evict), tuple(blocked))
