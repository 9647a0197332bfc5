"""The placement plan: which NUMA nodes, CPUs and GPUs an engine gets, and whom to evict.

Pure: a function of the config entry, the :class:`~ktd.core.topology.Topology` and
the current holdings. The daemon asks for a plan before every launch, and
``ktctl load --dry-run`` shows the same plan, so an operator sees exactly what
would happen (and who would be evicted) before committing minutes of loading.

Ground rules, from how kt-kernel behaves (see docs/sglang.md, "kt-kernel"):

* kt-kernel binds expert thread *i* of pool *p* to the *i*-th CPU of node
  ``numa_nodes[p]``, whatever affinity the parent set. Two engines on one node
  therefore fight for the same cores, so every running engine owns its NUMA
  nodes exclusively (and its GPUs, which hold its attention/dense weights).
* ``--kt-numa-nodes`` count must equal ``--kt-threadpool-count``; weights
  converted for N pools need N pools at launch.
* ``--kt-cpuinfer`` counts expert threads and should be physical cores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ktd.core import states as S
from ktd.core.ktflags import (
    NUMA_FLAG,
    PLACEMENT_FLAGS,
    POOL_FLAG,
    TP_FLAGS,
    KtFlag,
    cpus_for,
    flags_for,
    gpu_env,
    id_list,
    int_values,
    plural,
)
from ktd.core.topology import Topology, format_cpulist
from ktd.core.userflags import user_flags

__all__ = [
    "PLACEMENT_FLAGS",
    "Holding",
    "KtFlag",
    "Plan",
    "plan",
    "user_flags",
]

NumaRequest = Literal["auto", "all", "none"] | Sequence[int]
GpuRequest = Literal["auto"] | Sequence[int] | int


@dataclass(frozen=True)
class Holding:
    """A running (or starting) engine and the resources it owns."""

    alias: str
    numa_nodes: tuple[int, ...]
    gpus: tuple[int, ...]
    in_flight: int = 0
    pinned: bool = False
    last_used: float = 0.0
    state: str = S.READY
    sleeps: bool = False  # made room for by putting it to sleep, not stopping it

    @property
    def evictable(self) -> bool:
        """Only an idle, unpinned, ready engine may be evicted to make room.

        A starting engine is never evicted for another: killing a half-loaded
        model throws away minutes of work and invites load ping-pong.
        """
        return self.in_flight == 0 and not self.pinned and self.state == S.READY

    def describe(self, allow_evict: bool = True) -> str:
        """Why this holder stays, for ``blocked_by`` reasons."""
        parts: list[str] = []
        if self.in_flight:
            parts.append(f"{self.in_flight} in flight")
        if self.pinned:
            parts.append("pinned")
        if self.state != S.READY:
            parts.append(self.state)
        if not parts:
            parts.append("idle" if allow_evict else "idle; eviction not allowed")
        return f"{self.alias} ({', '.join(parts)})"


@dataclass(frozen=True)
class Plan:
    """The answer to "where would ALIAS run?". ``ok=False`` plans launch nothing."""

    alias: str
    ok: bool
    numa_nodes: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    flags: tuple[KtFlag, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    evict: tuple[str, ...] = ()
    sleeps: tuple[str, ...] = ()  # those of ``evict`` put to sleep rather than stopped
    blocked_by: tuple[str, ...] = ()
    reason: str | None = None
    notes: tuple[str, ...] = ()
    # ok=False only: no state of the other engines would help (unknown node, more
    # GPUs than the machine has). A config error, never something to wait for.
    impossible: bool = False

    def argv_flags(self) -> list[str]:
        """The derived flags for the command line; user-set ones already sit in extra_args."""
        out: list[str] = []
        for f in self.flags:
            if f.origin == "derived":
                out.append(f.name)
                out.extend(f.values)
        return out

    def flag(self, name: str) -> KtFlag | None:
        for f in self.flags:
            if f.name == name:
                return f
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for ``ktctl load --dry-run --json``."""
        return {
            "alias": self.alias,
            "ok": self.ok,
            "numa_nodes": list(self.numa_nodes),
            "cpus": list(self.cpus),
            "cpulist": format_cpulist(self.cpus),
            "gpus": list(self.gpus),
            "flags": [
                {"name": f.name, "values": list(f.values), "origin": f.origin} for f in self.flags
            ],
            "argv_flags": self.argv_flags(),
            "env": dict(self.env),
            "evict": list(self.evict),
            "sleeps": list(self.sleeps),
            "blocked_by": list(self.blocked_by),
            "reason": self.reason,
            "notes": list(self.notes),
            "impossible": self.impossible,
        }


# ---------------------------------------------------------------- user flags


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class _Need:
    """What the request needs: fixed ids, or ``count`` of any free ones."""

    fixed: tuple[int, ...] | None
    count: int


class _Fail(Exception):
    """An impossible request; becomes ``Plan(ok=False, reason=...)``."""

    def __init__(self, reason: str, blocked_by: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.blocked_by = blocked_by


class _Blocked(_Fail):
    """Possible on an empty machine, but other engines hold what is needed."""


@dataclass(frozen=True)
class _Ask:
    """One call's request, as :func:`plan` was given it: carried whole to the helpers."""

    alias: str
    numa: NumaRequest
    gpus: GpuRequest
    extra_args: Sequence[str]
    tp_size: int | None
    reserved_cpus: Sequence[int]
    cpu_reserve: int
    single_engine: bool
    allow_evict: bool


def plan(
    alias: str,
    numa: NumaRequest,
    gpus: GpuRequest,
    extra_args: Sequence[str],
    topo: Topology,
    holdings: Sequence[Holding],
    *,
    tp_size: int | None = None,
    reserved_cpus: Sequence[int] = (),
    cpu_reserve: int = 0,
    single_engine: bool = False,
    allow_evict: bool = True,
) -> Plan:
    """Plan ALIAS's placement. Never raises for bad requests: returns ``ok=False`` + reason.

    ``holdings`` are the engines whose processes may exist; a holding with the
    same alias (the engine being restarted) and ``state == "stopped"`` ones own
    nothing. ``reserved_cpus`` are kept off the engine (the daemon's own CPUs);
    ``cpu_reserve`` more cores are left for SGLang's own threads.
    """
    ask = _Ask(
        alias,
        numa,
        gpus,
        extra_args,
        tp_size,
        reserved_cpus,
        cpu_reserve,
        single_engine,
        allow_evict,
    )
    if numa == "none":
        return _unpinned(ask, topo, holdings)
    return _planned(ask, topo, holdings)


def _planned(ask: _Ask, topo: Topology, holdings: Sequence[Holding]) -> Plan:
    notes: list[str] = []
    try:
        return _plan(ask, topo, holdings, notes)
    except _Fail as exc:
        return Plan(
            alias=ask.alias,
            ok=False,
            blocked_by=exc.blocked_by,
            reason=exc.reason,
            notes=tuple(notes),
            impossible=not isinstance(exc, _Blocked),
        )


def _unpinned(ask: _Ask, topo: Topology, holdings: Sequence[Holding]) -> Plan:
    """``numa: "none"`` (ktd's extension): no NUMA ownership and no pinning; only GPUs
    are planned. kt-kernel still needs ``--kt-cpuinfer`` and ``--kt-threadpool-count``
    (without them it divides None by None when the first MoE layer is built), so
    they are derived from every CPU the engine may use; ``--kt-numa-nodes`` is
    left to kt-kernel (pool *i* on node *i*)."""
    free = [dataclasses.replace(h, numa_nodes=()) for h in holdings]
    p = _planned(dataclasses.replace(ask, numa="all", single_engine=False), topo, free)
    if not p.ok:
        return p
    return dataclasses.replace(
        p,
        numa_nodes=(),
        cpus=(),
        flags=tuple(f for f in p.flags if f.origin == "user" or f.name != NUMA_FLAG),
        notes=(
            *p.notes,
            "numa: none: not pinned, no NUMA node owned; --kt-threadpool-count and "
            "--kt-cpuinfer cover every usable CPU",
        ),
    )


def _numa_need(
    numa: NumaRequest,
    topo: Topology,
    uflags: Mapping[str, tuple[str, ...]],
    single_engine: bool,
    notes: list[str],
) -> _Need:
    usable = [n.id for n in topo.nodes if n.cpus]
    if not usable:
        raise _Fail("no NUMA node of this machine has an online CPU")
    # The user's --kt-numa-nodes is what kt-kernel will really use, so it is what
    # we must own; otherwise the exclusivity promise would be a lie.
    if NUMA_FLAG in uflags:
        return _flag_need(numa, topo, uflags[NUMA_FLAG], usable, notes)
    if numa == "all":
        skipped = sorted(set(topo.node_ids) - set(usable))
        if skipped:
            notes.append(f"NUMA nodes {id_list(skipped)} have no CPUs and are left out")
        return _Need(tuple(usable), len(usable))
    if not isinstance(numa, str):
        fixed = _usable_nodes(topo, list(numa), "numa")
        return _Need(fixed, len(fixed))
    if numa != "auto":
        raise _Fail(f"numa: expected 'auto', 'all' or a list of node ids, got {numa!r}")
    # auto: the user's --kt-threadpool-count says how many pools the weights were
    # converted for; honour it rather than pick a count the weights don't match
    # (this wins over single_engine's "all nodes" for the same reason).
    pools = int_values(uflags.get(POOL_FLAG, ()))
    if pools is not None and len(pools) == 1 and pools[0] >= 1:
        count = pools[0]
        if count > len(usable):
            raise _Fail(
                f"extra_args {POOL_FLAG} {count} needs {count} NUMA nodes; "
                f"machine has {len(usable)} with CPUs"
            )
        return _Need(None, count)
    if single_engine:
        return _Need(tuple(usable), len(usable))
    return _Need(None, 1)


def _usable_nodes(topo: Topology, ids: Sequence[int], what: str) -> tuple[int, ...]:
    """``ids`` once each, if every one is a node of this machine with online CPUs (a
    memory-only node can hold no kt-kernel thread pool), else why not."""
    known = set(topo.node_ids)
    if not ids:
        raise _Fail(f"{what} lists no NUMA node")
    for nid in ids:
        if nid not in known:
            raise _Fail(f"{what}: unknown NUMA node {nid} (machine has nodes {id_list(known)})")
        if not topo.node(nid).cpus:
            raise _Fail(
                f"{what}: NUMA node {nid} has no online CPUs (memory-only node); "
                "kt-kernel cannot run a thread pool there"
            )
    return tuple(dict.fromkeys(ids))


def _flag_need(
    numa: NumaRequest,
    topo: Topology,
    values: tuple[str, ...],
    usable: Sequence[int],
    notes: list[str],
) -> _Need:
    """The nodes of the user's ``--kt-numa-nodes``, which win over the config's ``numa``
    (said in a note when the two differ)."""
    ids = int_values(values)
    if ids is None:
        raise _Fail(f"extra_args {NUMA_FLAG} {' '.join(values)}: not node ids")
    fixed = _usable_nodes(topo, ids, f"extra_args {NUMA_FLAG}")
    config_ids: tuple[int, ...] | None = None
    if numa == "all":
        config_ids = tuple(usable)
    elif not isinstance(numa, str):
        config_ids = tuple(numa)
    if config_ids is not None and sorted(config_ids) != sorted(fixed):
        notes.append(
            f"numa={list(config_ids)} differs from {NUMA_FLAG} {' '.join(map(str, fixed))} "
            f"in extra_args; placing on the nodes kt-kernel will use ({id_list(fixed)})"
        )
    return _Need(fixed, len(fixed))


def tp_size_of(tp_size: int | None, uflags: Mapping[str, tuple[str, ...]]) -> int | None:
    """The tensor-parallel size a model runs with: its own field, else the user's flag."""
    return _tp_size(tp_size, uflags)


def _tp_size(tp_size: int | None, uflags: Mapping[str, tuple[str, ...]]) -> int | None:
    if tp_size is not None:
        return tp_size
    for name in TP_FLAGS:
        vals = int_values(uflags.get(name, ()))
        if vals and len(vals) == 1 and vals[0] >= 1:
            return vals[0]
    return None


def _gpu_need(gpus: GpuRequest, topo: Topology, tp: int | None, notes: list[str]) -> _Need:
    have = [g.index for g in topo.gpus]
    why_none = f" ({topo.gpu_error})" if topo.gpu_error else ""
    if isinstance(gpus, bool):
        raise _Fail(f"gpus: expected 'auto', a count or a list, got {gpus!r}")
    if isinstance(gpus, int):
        if gpus < 0:
            raise _Fail(f"gpus: {gpus} is negative")
        if gpus > len(have):
            raise _Fail(f"gpus: asks for {plural(gpus, 'GPU')}, machine has {len(have)}{why_none}")
        if tp is not None and gpus and gpus != tp:
            notes.append(f"gpus={gpus} but tp_size={tp}: SGLang needs one GPU per TP rank")
        return _Need(None, gpus)
    if isinstance(gpus, str):
        if gpus != "auto":
            raise _Fail(f"gpus: expected 'auto', a count or a list, got {gpus!r}")
        if not have:
            if tp is not None and tp > 1:
                notes.append(f"tp_size={tp} but no GPUs were found{why_none}")
            return _Need(None, 0)
        want = tp or 1
        if want > len(have):
            raise _Fail(f"tp_size={want} needs {plural(want, 'GPU')}, machine has {len(have)}")
        return _Need(None, want)
    ids = list(dict.fromkeys(gpus))
    if not have:
        if ids:
            notes.append(f"no GPUs were found{why_none}; trusting gpus={ids} from the config")
    else:
        unknown = [g for g in ids if g not in have]
        if unknown:
            raise _Fail(f"gpus: unknown GPU {id_list(unknown)} (machine has GPUs {id_list(have)})")
    if tp is not None and ids and len(ids) != tp:
        notes.append(f"gpus={ids} but tp_size={tp}: SGLang needs one GPU per TP rank")
    return _Need(tuple(ids), len(ids))


@dataclass(frozen=True)
class _Request:
    """What one plan asks for, against the engines that hold resources now."""

    nodes: _Need
    gpus: _Need
    others: tuple[Holding, ...]  # the other engines whose processes may exist
    usable_nodes: tuple[int, ...]  # the NUMA nodes with online CPUs
    mem_free: Mapping[int, int]  # per node, kB
    gpu_free_mib: Mapping[int, int]
    gpu_ids: tuple[int, ...]
    single_engine: bool


def _plan(ask: _Ask, topo: Topology, holdings: Sequence[Holding], notes: list[str]) -> Plan:
    uflags = user_flags(ask.extra_args)
    req = _Request(
        nodes=_numa_need(ask.numa, topo, uflags, ask.single_engine, notes),
        gpus=_gpu_need(ask.gpus, topo, _tp_size(ask.tp_size, uflags), notes),
        others=tuple(h for h in holdings if h.alias != ask.alias and h.state != S.STOPPED),
        usable_nodes=tuple(n.id for n in topo.nodes if n.cpus),
        mem_free={n.id: n.mem_free_kb for n in topo.nodes},
        gpu_free_mib={g.index: g.memory_total_mib - g.memory_used_mib for g in topo.gpus},
        gpu_ids=tuple(g.index for g in topo.gpus),
        single_engine=ask.single_engine,
    )
    (nodes, chosen_gpus), evict = _place(req, topo, ask.allow_evict)
    cpus, cpuinfer = cpus_for(topo, nodes, ask.reserved_cpus, ask.cpu_reserve, notes)
    node_cores = len(topo.physical_cores(topo.node_cpus(nodes)))
    flags = flags_for(uflags, nodes, cpuinfer, node_cores, notes)
    for h in evict:
        does = f"puts {h.alias} to sleep" if h.sleeps else f"evicts {h.alias}"
        notes.append(f"{does} (idle, least recently used) to free its resources")
    return Plan(
        alias=ask.alias,
        ok=True,
        numa_nodes=nodes,
        cpus=cpus,
        gpus=chosen_gpus,
        flags=flags,
        env=MappingProxyType(gpu_env(chosen_gpus)),
        evict=tuple(h.alias for h in evict),
        sleeps=tuple(h.alias for h in evict if h.sleeps),
        notes=tuple(notes),
    )


_Assignment = tuple[tuple[int, ...], tuple[int, ...]]  # (NUMA nodes, GPUs)


def _pick(
    need: _Need,
    avail: Sequence[int],
    live: Sequence[Holding],
    gone: Sequence[Holding],
    ids_of: Callable[[Holding], tuple[int, ...]],
    free_amount: Mapping[int, int],
) -> tuple[int, ...] | None:
    """``need``'s ids (fixed, or the best ``count`` of ``avail``), or None if ``live``
    engines hold them (``ids_of``: a holding's NUMA nodes, or its GPUs).

    Prefer ids free right now (one about to be vacated by ``gone`` still shows the
    evicted engine's memory as used), then most free memory, then lowest id.
    """
    held = {i for h in live for i in ids_of(h)}
    if need.fixed is not None:
        return None if held & set(need.fixed) else need.fixed
    left = [i for i in avail if i not in held]
    if len(left) < need.count:
        return None
    freed = {i for h in gone for i in ids_of(h)}
    left.sort(key=lambda i: (i in freed, -free_amount.get(i, 0), i))
    return tuple(sorted(left[: need.count]))


def _assign(req: _Request, gone: Sequence[Holding]) -> _Assignment | None:
    """Nodes and GPUs for the request if ``gone`` were evicted, else None."""
    gone_aliases = {h.alias for h in gone}
    live = [h for h in req.others if h.alias not in gone_aliases]
    if req.single_engine and live:
        return None
    nodes = _pick(req.nodes, req.usable_nodes, live, gone, _held_nodes, req.mem_free)
    if nodes is None:
        return None
    chosen_gpus = _pick(req.gpus, req.gpu_ids, live, gone, _held_gpus, req.gpu_free_mib)
    if chosen_gpus is None:
        return None
    return nodes, chosen_gpus


def _relevant(req: _Request, h: Holding) -> bool:
    """Could evicting ``h`` free something this request can use?"""
    if req.single_engine:
        return True
    if req.nodes.fixed is not None:
        node_hit = bool(set(h.numa_nodes) & set(req.nodes.fixed))
    else:
        node_hit = bool(set(h.numa_nodes) & set(req.usable_nodes))
    if req.gpus.fixed is not None:
        gpu_hit = bool(set(h.gpus) & set(req.gpus.fixed))
    else:
        gpu_hit = req.gpus.count > 0 and bool(h.gpus)
    return node_hit or gpu_hit


def _place(req: _Request, topo: Topology, allow_evict: bool) -> tuple[_Assignment, list[Holding]]:
    """The assignment, and whom it evicts (least recently used first, as few as
    will do). Raises ``_Blocked`` when no eviction allowed would make room."""
    got = _assign(req, ())
    if got is not None:
        return got, []
    candidates = (
        sorted(
            (h for h in req.others if h.evictable and _relevant(req, h)),
            key=lambda h: (h.last_used, h.alias),
        )
        if allow_evict
        else []
    )
    evict: list[Holding] = []
    for h in candidates:
        evict.append(h)
        if _assign(req, evict) is not None:
            break
    else:
        reason, blockers = _busy_reason(req, candidates, allow_evict)
        raise _Blocked(reason, blockers)
    evict = _minimal(req, evict)
    got = _assign(req, evict)
    assert got is not None
    evict.sort(key=lambda h: (h.last_used, h.alias))
    return got, evict


def _minimal(req: _Request, evict: list[Holding]) -> list[Holding]:
    """Keep the eviction minimal: drop any victim (most recently used first) whose
    eviction turns out unnecessary given the later ones."""
    for h in reversed(list(evict)):
        trial = [x for x in evict if x is not h]
        if _assign(req, trial) is not None:
            evict = trial
    return evict


def _held_nodes(h: Holding) -> tuple[int, ...]:
    return h.numa_nodes


def _held_gpus(h: Holding) -> tuple[int, ...]:
    return h.gpus


def _short(need: _Need, wanted: Sequence[int], held: set[int]) -> bool:
    """Do the holders of ``held`` keep ``need`` from being met out of ``wanted``?"""
    if need.fixed is not None:
        return bool(held & set(need.fixed))
    return len([i for i in wanted if i not in held]) < need.count


def _busy_reason(
    req: _Request, evictable: Sequence[Holding], allow_evict: bool
) -> tuple[str, tuple[str, ...]]:
    """Name every holder that keeps a contested resource: ``NUMA node 1 held by x (2 in flight)``.

    Only holders that stay count (those we could not evict); the operator needs
    to know whom to wait for or ``ktctl evict``, not the whole pool.
    """
    going = {h.alias for h in evictable}
    stay = [h for h in req.others if h.alias not in going]
    parts: list[str] = []
    blockers: list[Holding] = []

    def blame(what: str, h: Holding) -> None:
        parts.append(f"{what} held by {h.describe(allow_evict)}")
        if h not in blockers:
            blockers.append(h)

    if req.single_engine:
        for h in stay:
            blame("the machine (one engine per machine)", h)
    else:
        kinds: tuple[tuple[str, _Need, Sequence[int], Callable[[Holding], tuple[int, ...]]], ...]
        kinds = (
            ("NUMA node", req.nodes, req.usable_nodes, _held_nodes),
            ("GPU", req.gpus, req.gpu_ids, _held_gpus),
        )
        for what, need, every, held_by in kinds:
            held = {i for h in stay for i in held_by(h)}
            wanted = need.fixed if need.fixed is not None else every
            if _short(need, wanted, held):
                for i in sorted(wanted):
                    for h in stay:
                        if i in held_by(h):
                            blame(f"{what} {i}", h)
    if not parts:  # unreachable by construction; keep the reason honest if it ever is
        parts.append("the requested resources are held by other engines")
    return "busy: " + "; ".join(parts), tuple(h.alias for h in blockers)
