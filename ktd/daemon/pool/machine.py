"""The ``machine`` request: the topology read afresh, with which engine holds what.

Why its own request: the frontend's dashboard draws the machine (each NUMA node
with its CPUs and free memory, each GPU with its memory) coloured by the engines
holding its parts, and neither ``status`` (per engine) nor ``doctor`` (checks, slow)
has that picture. Memory changes as engines load, so the topology is read again for
each answer (nvidia-smi included, in a thread); answers less than ``max_age`` old are
shared, so several dashboards polling cost one read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import trio

from ktd import protocol as p
from ktd.core.topology import Topology
from ktd.daemon.engine import weights
from ktd.daemon.pool.pool import Pool

_KIB = 1024
_MIB = 1024 * 1024


def machine_reply(
    topo: Topology,
    holders: Iterable[p.Holder],
    history: Mapping[str, Sequence[float]],
    reserved_cpus: Sequence[int] = (),
) -> p.MachineReply:
    """The reply for ``topo`` (pure: values in, message out)."""
    return p.MachineReply(
        cpu_model=topo.cpu_model,
        nodes=[
            p.NodeInfo(
                id=n.id,
                cpus=list(n.cpus),
                mem_total=n.mem_total_kb * _KIB,
                mem_free=n.mem_free_kb * _KIB,
                mem_available=n.available_kb * _KIB,
            )
            for n in topo.nodes
        ],
        gpus=[
            p.GpuInfo(
                index=g.index,
                name=g.name,
                memory_total=g.memory_total_mib * _MIB,
                memory_used=g.memory_used_mib * _MIB,
            )
            for g in topo.gpus
        ],
        gpu_error=topo.gpu_error,
        reserved_cpus=list(reserved_cpus),
        holders=list(holders),
        load_history={alias: list(values) for alias, values in history.items()},
    )


def holders(pool: Pool) -> list[p.Holder]:
    """Engines whose placement is theirs now (the states that hold resources)."""
    out = []
    for e in pool.engines.values():
        if e.plan is None or not e.holds_resources():
            continue
        out.append(
            p.Holder(
                alias=e.alias,
                state=e.state,
                numa_nodes=list(e.plan.numa_nodes),
                cpus=list(e.plan.cpus),
                gpus=list(e.plan.gpus),
            )
        )
    return out


class MachineReader:
    """Reads the machine for ``machine`` requests, one read at a time, recent ones shared."""

    def __init__(self, pool: Pool, *, max_age: float = 1.0) -> None:
        self.pool = pool
        self.max_age = max_age
        self._lock = trio.Lock()
        self._topo: Topology | None = None
        self._read_at = -float("inf")

    async def _topology(self) -> Topology:
        async with self._lock:
            if self._topo is None or trio.current_time() - self._read_at > self.max_age:
                self._topo = await trio.to_thread.run_sync(weights.read_machine)
                self._read_at = trio.current_time()
            return self._topo

    async def reply(self) -> p.MachineReply:
        topo = await self._topology()
        # Holders and history are read after the (possibly slow) topology: they are current.
        pool = self.pool
        return machine_reply(topo, holders(pool), pool.load_history.loads, pool.settings.cpus or ())
