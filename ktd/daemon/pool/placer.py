"""Placement and swaps: where a launch goes, and what the engines in its way do about it.

The plan is pure (``ktd.core.placement``, given the machine and every other engine's
holdings) and so is the step taken on it (``ktd.core.eviction.place_step``): launch,
evict idle holders, wait for holders already leaving, wait for busy holders to go
idle, or refuse. This module carries the step out. While busy holders go idle they
*yield*: their gates hold back the requests that arrive from then on
(``ktd.core.admission``), so they finish the earlier ones and the swap happens, and
the later ones bring them back the same way once the new engine is idle in turn.
Placements that need room take turns in arrival order (``ktd.core.roomline``): a later
one waits its turn (``WaitTurn``) rather than take the room an earlier one waits for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from ktd.core import eviction, fit, placement
from ktd.core import states as S
from ktd.core.command import LaunchError, planner_args
from ktd.core.config import DaemonSection, ModelSpec
from ktd.core.placement import Holding, Plan
from ktd.core.roomline import RoomLine
from ktd.core.sglang_options import SGLangOptions
from ktd.core.states import Phase, Step, making_room
from ktd.core.topology import Topology
from ktd.daemon.engine import weights
from ktd.daemon.engine.engine import Busy, Engine, PlacementLike, Unplaceable
from ktd.daemon.engine.preflight import Refused
from ktd.daemon.offload import Offload, to_thread

log = logging.getLogger("ktd")

#: What a placement does out of the lock, or ``Use`` (it takes the room).
_Settled = eviction.Use | eviction.WaitIdle | eviction.WaitTurn


def holder_view(engine: Engine) -> eviction.HolderView:
    """What the swap policy reads of an engine."""
    return eviction.HolderView(
        alias=engine.alias,
        state=engine.state,
        want_up=engine.want_up,
        pinned=engine.spec.pinned,
        in_flight=engine.in_flight(),
        queue=tuple(w.ticket for w in engine.gate.line),
        held_from=engine.gate.cutoff,
        holds=engine.holds_resources(),
    )


def _where(
    plan: Plan | eviction.RoomPlan, own: weights.Occupant | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The NUMA nodes and GPUs a fit is about: a wake's own (``own``), else the plan's."""
    if own is not None:
        return own.nodes, own.gpus
    assert isinstance(plan, Plan), "a room plan is a wake's"
    return tuple(plan.numa_nodes), tuple(plan.gpus)


class Placer:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        settings: Callable[[], DaemonSection],
        *,
        ticket: Callable[[], int],
        update: Callable[[Engine], None],
        recall: Callable[[Engine, str], object],
        offload: Offload = to_thread,
    ) -> None:
        self.engines = engines
        self._settings = settings
        self._ticket = ticket  # the gates' arrival order: a swap's cutoff is one
        self._update = update  # an engine's gate looks again (a yield began or ended)
        self._recall = recall  # frontends stop routing to a yielding holder now
        self._offload = offload  # the fit's reads of weight headers and /proc
        self._lock = trio.Lock()
        self._topology: Topology | None = None
        self._changed = trio.Event()  # any engine's state or holders changed
        self._line = RoomLine()  # placements that need room, in arrival order

    def poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = weights.read_machine()
        return self._topology

    def refresh_topology(self, topo: Topology) -> None:
        self._topology = topo

    def holdings(self, exclude: Engine | None = None) -> list[Holding]:
        out = []
        for e in self.engines.values():
            if e is exclude or e.plan is None or not e.holds_resources():
                continue
            out.append(
                Holding(
                    alias=e.alias,
                    numa_nodes=tuple(e.plan.numa_nodes),
                    gpus=tuple(e.plan.gpus),
                    in_flight=e.in_flight(),
                    pinned=e.spec.pinned,
                    last_used=e.idle_since if e.idle_since is not None else 0.0,
                    state=e.state,
                    sleeps=e.sleep_mode() == "on",
                )
            )
        return out

    def make_plan(
        self,
        spec: ModelSpec,
        *,
        exclude: Engine | None = None,
        catalog: SGLangOptions | None = None,
    ) -> Plan:
        """The placement of ``spec`` given every other engine's holdings (pure given those).

        With ``catalog`` the user's flags are read as SGLang reads them (prefixes
        included); raises :class:`~ktd.core.command.LaunchError` for ones it would refuse.
        """
        d = self._settings()
        return placement.plan(
            spec.alias,
            spec.numa,
            spec.gpus,
            planner_args(spec.extra_args, catalog),
            self.topology,
            self.holdings(exclude),
            tp_size=spec.tp_size,
            reserved_cpus=tuple(d.cpus or ()),
            cpu_reserve=d.cpu_reserve,
            single_engine=d.one_engine_per_machine or len(self.engines) == 1,
            allow_evict=spec.swap,
        )

    async def fit(
        self,
        spec: ModelSpec,
        plan: Plan | eviction.RoomPlan,
        stop: tuple[str, ...] = (),
        *,
        waker: Engine | None = None,
    ) -> tuple[fit.Estimate, fit.Fit]:
        """The memory estimate of ``spec`` on ``plan``, counting what its evictions free
        (a victim that will sleep frees its GPU memory but its residue, and takes host
        memory for the copy of its GPU weights unless it holds one already) and what
        stopping the sleepers ``stop`` frees (their host memory and residue). For a
        wake (``waker``: the engine, asleep, whose own nodes and GPUs ``plan`` frees)
        only the GPU memory its residue does not cover is asked."""
        going = [self.engines[a] for a in (*plan.evict, *stop) if a in self.engines]
        sleepers: list[weights.Occupant] = []
        victims: list[weights.Occupant] = []
        for v in going:
            occupant = v.occupant()
            if occupant is None:
                continue
            sleeps = self._will_sleep(v) and v.alias not in stop
            (sleepers if sleeps else victims).append(occupant)
        own = waker.occupant() if waker is not None else None
        nodes, gpus = _where(plan, own)
        return await self._offload(
            weights.verdict,
            spec,
            nodes,
            gpus,
            victims,
            tuple(plan.evict) + stop,
            sleepers,
            own,
        )

    @staticmethod
    def _will_sleep(engine: Engine) -> bool:
        """Made room for by sleeping, not stopping (or already asleep)."""
        return engine.state == S.ASLEEP or engine.sleep_mode() == "on"

    def sleepers(self, nodes: tuple[int, ...], *, besides: Engine | None = None) -> list[Engine]:
        """Asleep engines whose host memory is on ``nodes``, least recently used first:
        stopped, in that order, when a load's (or a wake's) memory does not fit beside
        them."""
        out = [
            e
            for e in self.engines.values()
            if e.state == S.ASLEEP
            and e is not besides
            and e.plan is not None
            and (not nodes or not e.plan.numa_nodes or set(nodes) & set(e.plan.numa_nodes))
        ]
        return sorted(out, key=lambda e: e.idle_since if e.idle_since is not None else 0.0)

    async def _fit_or_stop_sleepers(
        self, engine: Engine, plan: Plan | eviction.RoomPlan, *, waking: bool = False
    ) -> None:
        """The memory check of a load or a wake, before anything is evicted. Short of
        memory with sleepers on its nodes: stop the least recently used until it fits
        (a wake is never discovered short by a failed resume)."""
        waker = engine if waking else None
        _, verdict = await self.fit(engine.spec, plan, waker=waker)
        if not verdict.refuses:  # no GPU alone refuses nothing (``fit.Fit``)
            return
        stop: tuple[str, ...] = ()
        nodes, _ = _where(plan, engine.occupant() if waking else None)
        for sleeper in self.sleepers(nodes, besides=engine):
            stop += (sleeper.alias,)
            _, verdict = await self.fit(engine.spec, plan, stop, waker=waker)
            if not verdict.refuses:
                break
        if verdict.refuses:
            raise Refused(f"{verdict.reason}; no engine was stopped")
        why = f"stopped to make room in memory for {engine.alias}"
        for alias in stop:
            victim = self.engines[alias]
            victim.log.note(why)
            victim.stats.evictions += 1
            victim.request_down(reason=why)
        for alias in stop:
            await self.engines[alias].wait_stopped()

    async def place(self, engine: Engine) -> PlacementLike | None:
        """Plan, evict idle engines in the way, or wait for busy ones to become idle.

        Pinned holders, or ``swap: false`` on ``engine``, make it a plain ``Busy``.
        Returns None when ``engine`` stopped being wanted while it waited.
        """

        def plan() -> Plan:
            return self.make_plan(engine.spec, exclude=engine, catalog=engine.catalog)

        def take(placed: Plan | eviction.RoomPlan) -> None:
            # Placed is holding: the next plan made under the lock must see it.
            engine.plan = placed if isinstance(placed, Plan) else None

        placed = await self._place(engine, plan, take, fitted=engine.spec.fit == "ignore")
        return placed if isinstance(placed, Plan) else None

    async def make_room(self, engine: Engine) -> str | None:
        """A wake: free ``engine``'s own NUMA nodes and GPUs of awake engines, as a load
        does (idle ones sleep or stop, busy ones are waited for while they yield).
        None when done; else why not (the engine stays asleep)."""
        own = engine.plan
        if own is None:
            return None

        def plan() -> eviction.RoomPlan:
            holders = self.holdings(exclude=engine)
            return eviction.room_for(own.numa_nodes, own.gpus, holders)

        def take(_: Plan | eviction.RoomPlan) -> None:
            # The room is its own from now on (``states.holds``): a second wake planned
            # under the lock after this one waits for it instead of taking the room too.
            engine.set_phase(Phase.of(Step.RESUMING))

        try:
            fitted = engine.spec.fit == "ignore"
            if await self._place(engine, plan, take, fitted=fitted) is None:
                return "the wake was called off"
        except (Busy, Unplaceable, Refused) as exc:
            return str(exc)
        return None

    async def _place(
        self,
        engine: Engine,
        planner: Callable[[], Plan | eviction.RoomPlan],
        take: Callable[[Plan | eviction.RoomPlan], None],
        *,
        fitted: bool,
    ) -> Plan | eviction.RoomPlan | None:
        """Plan, make room, take it. The lock is held from a plan to the room it makes
        and until ``take`` has made the room ``engine``'s own, so that nobody placed in
        between takes the room an eviction freed (a victim woken again by its next
        request waits for the lock and then finds the room taken); it is let go only
        while busy holders are waited for (they yield meanwhile) or while ``engine``
        waits its turn behind earlier placements (``ktd.core.roomline``)."""
        cuts: dict[str, tuple[Engine, int]] = {}  # holder -> this placement's cut on it
        try:
            while True:
                async with self._lock:
                    plan, step, fitted = await self._settle(engine, planner, fitted)
                    if isinstance(step, eviction.Use):
                        take(plan)
                        return plan
                    if isinstance(step, eviction.WaitIdle):
                        self._cut(engine, step.aliases, cuts)
                if isinstance(step, eviction.WaitTurn):
                    waited = await self._wait_turn(engine, step.ahead)
                else:
                    waited = await self._wait_idle(engine, [cuts[a] for a in step.aliases])
                if not waited:
                    return None
        finally:
            self._line.leave(engine.alias)
            for h, cut in cuts.values():
                h.gate.release(cut)
                self._update(h)
                h.notify_changed()
            self.poke()  # the line moved: who waits its turn plans again

    async def _settle(
        self,
        engine: Engine,
        planner: Callable[[], Plan | eviction.RoomPlan],
        fitted: bool,
    ) -> tuple[Plan | eviction.RoomPlan, _Settled, bool]:
        """Under the lock: plans acted on until one is usable (``Use``), waits for busy
        holders (``WaitIdle``) or waits its turn (``WaitTurn``); idle holders are
        evicted and leaving ones waited for on the way, and a plan that cannot launch
        raises. ``fitted``: the memory fit is done (it is, in what this returns)."""
        while True:
            plan = planner()
            if plan.ok and not fitted:
                # Once, before anything is evicted: after an eviction the
                # victim's memory may take a while to show up as free.
                fitted = True
                waking = isinstance(plan, eviction.RoomPlan)
                await self._fit_or_stop_sleepers(engine, plan, waking=waking)
            named = (*plan.blocked_by, *plan.evict)
            views = {a: holder_view(self.engines[a]) for a in named if a in self.engines}
            step = eviction.place_step(plan, views, swap=engine.spec.swap)
            holding = {a for a, e in self.engines.items() if e.holds_resources()}
            step = self._line.step(engine.alias, step, holding)
            if isinstance(step, eviction.StopIdle):
                await self._evict_for(engine, step.aliases)
            elif isinstance(step, eviction.WaitLeaving):
                for alias in step.aliases:
                    await self.engines[alias].wait_off()
            elif isinstance(step, eviction.NoLaunch):
                if step.impossible:
                    raise Unplaceable(step.reason)
                raise Busy(step.reason, step.blocked_by)
            else:
                return plan, step, fitted

    def _cut(
        self, engine: Engine, aliases: tuple[str, ...], cuts: dict[str, tuple[Engine, int]]
    ) -> None:
        """Busy holders yield to ``engine``: each one's gate holds back requests from this
        placement's cut on (one per holder, kept in ``cuts`` and released when the
        placement ends; an earlier swap's cut stays in force before it) and the
        frontends stop routing there; requests under way finish."""
        for alias in aliases:
            h = self.engines[alias]
            if alias not in cuts:
                cuts[alias] = (h, self._ticket())
                h.gate.hold_back(cuts[alias][1])
                self._update(h)
            # Frontends stop routing there now; their requests under way finish.
            self._recall(h, f"yielding to {engine.alias}")

    async def _wait_idle(self, engine: Engine, cuts: list[tuple[Engine, int]]) -> bool:
        """Out of the lock: until every holder is idle from its cut on. False: the
        engine is no longer wanted."""
        holders = tuple(h.alias for h, _ in cuts)
        engine.set_phase(Phase.of(Step.WAITING, engines=holders))
        engine.log.note(f"waiting for {', '.join(holders)} to become idle")

        def idle() -> bool:
            return all(eviction.idle_for(holder_view(h), cut) for h, cut in cuts)

        while engine.want_up and not idle():
            await self._next_change()
        return engine.want_up

    async def _wait_turn(self, engine: Engine, ahead: tuple[str, ...]) -> bool:
        """Out of the lock: until anything changes (the line may have moved), then plan
        again. False: the engine is no longer wanted."""
        phase = Phase.of(Step.WAITING, f"waiting its turn after {', '.join(ahead)}", ahead)
        if engine.phase != phase:
            engine.set_phase(phase)
            engine.log.note(f"waiting its turn for room after {', '.join(ahead)}")
        if engine.want_up:
            await self._next_change()
        return engine.want_up

    async def _next_change(self) -> None:
        changed = self._changed
        with trio.move_on_after(1.0):  # belt and braces: re-check now and then
            await changed.wait()

    async def _evict_for(self, engine: Engine, aliases: tuple[str, ...]) -> None:
        """Make room: a victim that can sleep is put to sleep (its experts stay in host
        RAM; waking it is a swap in seconds), any other is stopped."""
        sleepers = tuple(a for a in aliases if self.engines[a].sleep_mode() == "on")
        text = making_room(tuple(a for a in aliases if a not in sleepers), sleepers)
        engine.set_phase(Phase.of(Step.MAKING_ROOM, text, engines=aliases))
        stopped: tuple[str, ...] = ()
        for alias in aliases:
            victim = self.engines[alias]
            victim.stats.evictions += 1
            if victim.sleep_mode() == "on":
                why = f"put to sleep to make room for {engine.alias}"
                victim.log.note(why)
                victim.request_sleep(reason=why)
            else:
                why = f"evicted to make room for {engine.alias}"
                victim.log.note(why)
                victim.request_down(reason=why)
                stopped += (alias,)
        engine.stats.made_room = tuple(dict.fromkeys(engine.stats.made_room + stopped))
        engine.stats.owed = bool(engine.stats.made_room)
        for alias in aliases:
            await self.engines[alias].wait_off()

    def bring_back(self, engine: Engine) -> tuple[str, ...]:
        """``engine``'s launch failed before ready: start again what it stopped for room,
        when it still fits without stopping anything. Returns what was started."""
        made = engine.stats.made_room
        if not made or not engine.stats.owed:
            return ()
        engine.stats.owed = False
        stopped: dict[str, bool] = {}
        fits: dict[str, bool] = {}
        for alias in made:
            victim = self.engines.get(alias)
            if victim is None or victim.retired:
                continue
            stopped[alias] = victim.state in (S.STOPPED, S.FAILED) and not victim.want_up
            if stopped[alias]:
                try:
                    plan = self.make_plan(victim.spec, exclude=victim, catalog=victim.catalog)
                except LaunchError:  # its own load will say so
                    continue
                fits[alias] = plan.ok and not plan.evict
        back = eviction.bring_back(made, stopped=stopped, fits=fits)
        for alias in back:
            victim = self.engines[alias]
            victim.log.note(f"started again: {engine.alias}, which it was stopped for, failed")
            victim.request_up()
        return back
