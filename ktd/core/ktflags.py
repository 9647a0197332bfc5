"""The kt-kernel flags a placement derives, and what is wrong with the user's own.

Apart from the plan (``ktd.core.placement``) because they are kt-kernel's rules, not
placement's: ``--kt-numa-nodes`` must list as many nodes as ``--kt-threadpool-count``
counts pools (weights converted for N pools need N pools), ``--kt-cpuinfer`` counts
expert threads and should be physical cores, and CUDA numbers GPUs its own way unless
told to use PCI bus order. A flag the user set wins; the notes say what it breaks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ktd.core.topology import Topology

NUMA_FLAG = "--kt-numa-nodes"
POOL_FLAG = "--kt-threadpool-count"
CPUINFER_FLAG = "--kt-cpuinfer"
PLACEMENT_FLAGS = (NUMA_FLAG, POOL_FLAG, CPUINFER_FLAG)
TP_FLAGS = ("--tp-size", "--tensor-parallel-size", "--tp")


@dataclass(frozen=True)
class KtFlag:
    """A kt placement flag and who decided its value."""

    name: str
    values: tuple[str, ...]
    origin: Literal["derived", "user"]


def int_values(values: Sequence[str]) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except ValueError:
        return None


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def id_list(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(set(ids))) or "none"


def cpus_for(
    topo: Topology,
    nodes: tuple[int, ...],
    reserved_cpus: Sequence[int],
    cpu_reserve: int,
    notes: list[str],
) -> tuple[tuple[int, ...], int]:
    """The CPUs of ``nodes`` the engine may use, and its ``--kt-cpuinfer`` (physical
    cores not reserved, less ``cpu_reserve`` for SGLang's own threads)."""
    reserved = set(reserved_cpus)
    node_cpus = topo.node_cpus(nodes)
    cpus = tuple(c for c in node_cpus if c not in reserved)
    if node_cpus and not cpus:
        notes.append(f"every CPU of NUMA nodes {id_list(nodes)} is reserved")
    reserved_cores = {topo.core_of.get(c, (-1, -1 - c)) for c in reserved}
    cores = [c for c in topo.physical_cores(node_cpus) if core_of(topo, c) not in reserved_cores]
    return cpus, max(1, len(cores) - max(0, cpu_reserve))


def gpu_env(gpus: tuple[int, ...]) -> dict[str, str]:
    """nvidia-smi numbers GPUs in PCI bus order, CUDA by default "fastest first":
    without CUDA_DEVICE_ORDER the indices we planned are not the ones CUDA opens."""
    if not gpus:
        return {}
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
    }


def core_of(topo: Topology, cpu: int) -> tuple[int, int]:
    return topo.core_of.get(cpu, (-1, -1 - cpu))


def flags_for(
    uflags: Mapping[str, tuple[str, ...]],
    nodes: tuple[int, ...],
    cpuinfer: int,
    node_cores: int,
    notes: list[str],
) -> tuple[KtFlag, ...]:
    derived = {
        NUMA_FLAG: tuple(str(n) for n in nodes),
        POOL_FLAG: (str(len(nodes)),),
        CPUINFER_FLAG: (str(cpuinfer),),
    }
    flags = tuple(
        KtFlag(name, uflags[name], "user")
        if name in uflags
        else KtFlag(name, derived[name], "derived")
        for name in PLACEMENT_FLAGS
    )
    by_name = {f.name: f for f in flags}
    numa_count = len(by_name[NUMA_FLAG].values)
    pools = int_values(by_name[POOL_FLAG].values)
    if pools is None or len(pools) != 1:
        notes.append(f"{POOL_FLAG} {' '.join(by_name[POOL_FLAG].values)} is not one number")
    elif pools[0] != numa_count:
        notes.append(
            f"{NUMA_FLAG} lists {plural(numa_count, 'node')} but {POOL_FLAG} is {pools[0]}: "
            "kt-kernel requires them to be equal"
        )
    infer = int_values(by_name[CPUINFER_FLAG].values)
    if (
        by_name[CPUINFER_FLAG].origin == "user"
        and infer is not None
        and len(infer) == 1
        and infer[0] > node_cores
    ):
        notes.append(
            f"{CPUINFER_FLAG} {infer[0]} exceeds the {node_cores} physical cores of "
            f"NUMA nodes {id_list(nodes)}: expert threads will share cores"
        )
    return flags
