"""Machine topology (pure): NUMA nodes, CPU cores, ISA flags and GPUs as values, and
the parsers of the texts they are read from (CPU lists, ``nvidia-smi`` CSV).

``ktd.topology`` reads them from sysfs/procfs; placement and doctor reason on them
without the hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ktd.core.cpulist import format_cpulist, parse_cpulist

__all__ = [
    "Gpu",
    "NumaNode",
    "Topology",
    "format_cpulist",
    "parse_cpulist",
    "parse_nvidia_smi",
]

NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total,memory.used", "--format=csv")
#: What each process holds on which GPU (an asleep engine's residue): the GPUs' uuids to
#: their indexes, then the compute processes by GPU uuid.
NVIDIA_SMI_UUIDS = ("--query-gpu=index,uuid", "--format=csv,noheader")
NVIDIA_SMI_APPS = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT = 15.0

_AMX = ("amx_tile", "amx_int8", "amx_bf16")
_AVX512 = ("avx512f", "avx512bw")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node. ``cpus`` are online CPUs only (hyperthreads included)."""

    id: int
    cpus: tuple[int, ...]
    mem_total_kb: int
    mem_free_kb: int
    hugepages_total: int = 0  # 2 MiB pages reserved on this node
    hugepages_free: int = 0
    # MemFree plus reclaimable page cache and slab: after a model was evicted its
    # weights sit in the page cache, and MemFree alone would refuse the next load.
    mem_available_kb: int = 0

    @property
    def available_kb(self) -> int:
        return max(self.mem_available_kb, self.mem_free_kb)


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi numbers it (PCI bus order)."""

    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int


@dataclass(frozen=True)
class Topology:
    """What placement and doctor need to know about the machine, and nothing else."""

    nodes: tuple[NumaNode, ...]
    cpu_model: str
    flags: frozenset[str]
    core_of: Mapping[int, tuple[int, int]] = field(hash=False)  # cpu -> (package, core)
    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None

    # ------------------------------------------------------------ lookups

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every online CPU of the machine, sorted."""
        return tuple(sorted(c for n in self.nodes for c in n.cpus))

    def node(self, node_id: int) -> NumaNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no NUMA node {node_id} (machine has {_ids(self.node_ids)})")

    def node_cpus(self, node_ids: Iterable[int]) -> list[int]:
        """All online CPUs of the given nodes, sorted. Unknown node ids raise KeyError."""
        out: set[int] = set()
        for nid in node_ids:
            out.update(self.node(nid).cpus)
        return sorted(out)

    def physical_cores(self, cpus: Iterable[int]) -> list[int]:
        """One CPU (the lowest) per physical core among ``cpus``, sorted.

        kt-kernel's ``--kt-cpuinfer`` should count physical cores: two expert
        threads on the hyperthreads of one core fight for the same AMX/AVX units.
        A CPU whose core is unknown counts as a core of its own.
        """
        first: dict[tuple[int, int], int] = {}
        for cpu in sorted(set(cpus)):
            key = self.core_of.get(cpu, (-1, -1 - cpu))
            first.setdefault(key, cpu)
        return sorted(first.values())

    @property
    def packages(self) -> tuple[int, ...]:
        """Distinct physical packages (sockets) among online CPUs."""
        return tuple(sorted({pkg for pkg, _ in self.core_of.values()}))

    # ------------------------------------------------------------ ISA

    def has_flag(self, flag: str) -> bool:
        """``/proc/cpuinfo`` spells some flags with or without ``_`` (avx512_bf16/avx512bf16)."""
        return flag in self.flags or flag.replace("_", "") in self.flags

    def isa(self) -> str:
        """The best matrix ISA kt-kernel can use here: ``amx``, ``avx512``, ``avx2`` or ``none``."""
        if all(self.has_flag(f) for f in _AMX):
            return "amx"
        if all(self.has_flag(f) for f in _AVX512):
            return "avx512"
        if self.has_flag("avx2"):
            return "avx2"
        return "none"

    def isa_extras(self) -> tuple[str, ...]:
        """AVX-512 extensions that change which kt-kernel build runs fast (VNNI, VBMI, BF16)."""
        return tuple(
            name
            for name, flag in (
                ("vnni", "avx512_vnni"),
                ("vbmi", "avx512_vbmi"),
                ("bf16", "avx512_bf16"),
            )
            if self.has_flag(flag)
        )

    def kt_variant(self) -> str | None:
        """The variant kt-kernel's own ``_cpu_detect`` would load, or None if it cannot run.

        Mirrors kt-kernel's progressive matching (amx needs the full AVX-512 set
        too), so doctor can say which ``.so`` the engine will pick before loading
        600 GB of weights.
        """
        avx512 = ["avx512f", "avx512bw"]
        ladder = [
            ("amx", [*_AMX, *avx512, "avx512_vnni", "avx512_vbmi", "avx512_bf16"]),
            ("avx512_bf16", [*avx512, "avx512_vnni", "avx512_vbmi", "avx512_bf16"]),
            ("avx512_vbmi", [*avx512, "avx512_vnni", "avx512_vbmi"]),
            ("avx512_vnni", [*avx512, "avx512_vnni"]),
            ("avx512_base", avx512),
            ("avx2", ["avx2"]),
        ]
        for name, need in ladder:
            if all(self.has_flag(f) for f in need):
                return name
        return None

    def cpu_dict(self) -> dict[str, Any]:
        """The CPU as kt-kernel judges it: its model, the matrix ISA, the AVX-512 extras
        and the build it would load (doctor's summary and the catalog's box both open
        with it)."""
        return {
            "cpu_model": self.cpu_model,
            "isa": self.isa(),
            "isa_extras": list(self.isa_extras()),
            "kt_variant": self.kt_variant(),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary for ``ktctl doctor --json`` (flags reduced to the relevant ones)."""
        return {
            **self.cpu_dict(),
            "packages": len(self.packages),
            "cpus": len(self.cpus),
            "physical_cores": len(self.physical_cores(self.cpus)),
            "nodes": [
                {
                    "id": n.id,
                    "cpus": format_cpulist(n.cpus),
                    "physical_cores": len(self.physical_cores(n.cpus)),
                    "mem_total_kb": n.mem_total_kb,
                    "mem_free_kb": n.mem_free_kb,
                    "hugepages_total": n.hugepages_total,
                    "hugepages_free": n.hugepages_free,
                }
                for n in self.nodes
            ],
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "memory_total_mib": g.memory_total_mib,
                    "memory_used_mib": g.memory_used_mib,
                }
                for g in self.gpus
            ],
            "gpu_error": self.gpu_error,
        }


def _ids(ids: Iterable[int]) -> str:
    text = format_cpulist(ids)
    return text or "none"


# ---------------------------------------------------------------- nvidia-smi


def _mib(value: str) -> int:
    """``"81920 MiB"`` / ``"81920"`` -> 81920; ``"[N/A]"`` (some MIG/GH200 setups) -> 0."""
    text = value.strip()
    if text.lower().endswith("mib"):
        text = text[:-3].strip()
    try:
        return int(float(text))
    except ValueError:
        if text.startswith("[") or text.upper() in ("N/A", ""):
            return 0
        raise ValueError(f"bad memory value {value!r}") from None


def parse_numa_maps(text: str) -> dict[int, int]:
    """Bytes resident on each NUMA node, from ``/proc/PID/numa_maps`` (``N0=5`` pages of
    ``kernelpagesize_kB=4`` on each line). Lines of another shape are skipped."""
    use: dict[int, int] = {}
    for line in text.splitlines():
        fields = line.split()
        page = 4096
        pages: list[tuple[int, int]] = []
        for f in fields[2:]:
            key, _, value = f.partition("=")
            if key == "kernelpagesize_kB" and value.isdigit():
                page = int(value) * 1024
            elif key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                pages.append((int(key[1:]), int(value)))
        for node, n in pages:
            use[node] = use.get(node, 0) + n * page
    return use


def parse_gpu_use(uuids_csv: str, apps_csv: str, pids: Iterable[int]) -> dict[int, int]:
    """Bytes the processes ``pids`` hold on each GPU index, from nvidia-smi's
    ``NVIDIA_SMI_UUIDS`` and ``NVIDIA_SMI_APPS`` answers. Raises ValueError for a line
    of another shape."""
    index: dict[str, int] = {}
    for line in uuids_csv.splitlines():
        if line.strip():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 2 or not fields[0].isdigit():
                raise ValueError(f"unexpected nvidia-smi line {line.strip()!r}")
            index[fields[1]] = int(fields[0])
    wanted = set(pids)
    use: dict[int, int] = {}
    for line in apps_csv.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[1].isdigit():
            raise ValueError(f"unexpected nvidia-smi line {line.strip()!r}")
        if int(fields[1]) in wanted and fields[0] in index:
            gpu = index[fields[0]]
            use[gpu] = use.get(gpu, 0) + _mib(fields[2]) * (1 << 20)
    return use


def parse_nvidia_smi(csv_text: str) -> tuple[Gpu, ...]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv``.

    Tolerates ``noheader``/``nounits`` output and commas inside GPU names (the
    first field is the index, the last two are memory, the rest is the name).
    Raises ValueError for a line that is not a GPU row.
    """
    gpus: list[Gpu] = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if fields[0].lower() == "index":
            continue  # header
        if len(fields) < 4:
            raise ValueError(f"unexpected nvidia-smi line {line.strip()!r}")
        try:
            index = int(fields[0])
        except ValueError:
            raise ValueError(f"unexpected nvidia-smi line {line.strip()!r}") from None
        name = ", ".join(fields[1:-2])
        gpus.append(Gpu(index, name, _mib(fields[-2]), _mib(fields[-1])))
    return tuple(sorted(gpus, key=lambda g: g.index))
