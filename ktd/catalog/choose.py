"""Which variant of a catalog entry this box can run, and why not each other one. Pure.

The box is a :class:`~ktd.core.topology.Topology` (the daemon reads it from
``$KTD_SYSFS_ROOT`` and ``$KTD_NVIDIA_SMI`` as placement does; tests build fixture
trees). Variants are tried in the entry's order (its preference); the first with no
reason against it is chosen. Reasons, each with the numbers:

* a CPU feature the variant's ``--kt-method`` needs and ``/proc/cpuinfo`` lacks;
* CPU weights that need a conversion ktd does not run (unless converted weights are
  already given);
* no GPU (SGLang runs attention on a CUDA GPU; kt moves only the experts);
* less host RAM or GPU memory in the box than the sources say the variant needs;
* an upload converted for more NUMA pools than the box has nodes.

A need no source states is not checked, and said so (``unknown``): never assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ktd.catalog.schema import Entry, Variant
from ktd.core.topology import Topology

__all__ = ["GB", "Choice", "Verdict", "choose", "gb"]

GB = 1_000_000_000  # the sources state sizes in (decimal) GB
_MIB = 1 << 20


def gb(n: float) -> str:
    return f"{n / GB:,.0f} GB"


@dataclass(frozen=True)
class Verdict:
    """One variant against this box: ``reasons`` it cannot run (empty: it can), and
    ``unknown``: needs no source states, which were therefore not checked."""

    variant: Variant
    reasons: tuple[str, ...]
    unknown: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class Choice:
    entry: Entry
    verdicts: tuple[Verdict, ...]

    @property
    def chosen(self) -> Verdict | None:
        return next((v for v in self.verdicts if v.fits), None)

    def why(self) -> str:
        """One line: the chosen variant and why, or why none fits."""
        c = self.chosen
        if c is not None:
            method = c.variant.kt_method or "plain SGLang"
            return f"{c.variant.name} ({method}): the first variant this box can run"
        return "none fits this box: " + "; ".join(
            f"{v.variant.name}: {v.reasons[0]}" for v in self.verdicts
        )


def host_ram(topo: Topology) -> int:
    """The box's RAM in bytes (every NUMA node's total)."""
    return sum(n.mem_total_kb for n in topo.nodes) * 1024


def gpu_memory(topo: Topology) -> int:
    return sum(g.memory_total_mib for g in topo.gpus) * _MIB


def _cpu(v: Variant, topo: Topology) -> list[str]:
    missing = [f for f in v.cpu if not topo.has_flag(f)]
    if not missing:
        return []
    what = f"--kt-method {v.kt_method}" if v.kt_method else "it"
    cpu = topo.cpu_model or "this CPU"
    return [f"{what} needs {', '.join(v.cpu)}; {cpu} lacks {', '.join(missing)}"]


def verdict(
    entry: Entry,
    v: Variant,
    topo: Topology,
    *,
    converted: bool = False,
    numa_count: int | None = None,
) -> Verdict:
    """``converted``: CPU weights converted for this variant are already given (a
    ``kt_weight_path``). ``numa_count``: the NUMA count read from weights on disk (else
    the source's, when it states one)."""
    reasons = _cpu(v, topo)
    unknown: list[str] = []
    if v.weights == "convert" and not converted:
        reasons.append(
            f"its CPU weights need a conversion ktd does not run ({v.kt_method}: "
            "see the variant's convert)"
        )
    if entry.needs.gpu and not topo.gpus:
        why = f" ({topo.gpu_error})" if topo.gpu_error else ""
        reasons.append(f"no GPU found{why}: SGLang runs attention on a CUDA GPU")
    ram_gb = v.host_ram_gb or entry.needs.host_ram_gb
    if ram_gb is None:
        unknown.append("host RAM")
    elif host_ram(topo) < ram_gb * GB:
        reasons.append(f"needs {ram_gb:,.0f} GB of RAM; this box has {gb(host_ram(topo))}")
    gpu_gb = entry.needs.gpu_mem_gb
    if gpu_gb is None:
        unknown.append("GPU memory")
    elif topo.gpus and gpu_memory(topo) < gpu_gb * GB:
        reasons.append(
            f"needs {gpu_gb:,.0f} GB of GPU memory; the GPUs have {gb(gpu_memory(topo))} in all"
        )
    if v.weights == "kt-weights":
        src = entry.source("kt-weights", v.kt_method)
        count = numa_count if numa_count is not None else (src.numa_count if src else None)
        if count is None:
            unknown.append("the NUMA count the weights were converted for (read after the pull)")
        elif count > len(topo.nodes):
            reasons.append(
                f"the weights were converted for {count} NUMA pools; this box has "
                f"{len(topo.nodes)} NUMA node{'s' if len(topo.nodes) != 1 else ''}"
            )
    return Verdict(v, tuple(reasons), tuple(unknown))


def choose(
    entry: Entry,
    topo: Topology,
    *,
    converted: Sequence[str] = (),
    numa_counts: dict[str, int] | None = None,
) -> Choice:
    """Every variant's verdict, in the entry's order; ``Choice.chosen`` is the first
    that fits. ``converted``: variants whose converted weights are given;
    ``numa_counts``: NUMA counts read from weights on disk, by variant name."""
    counts = numa_counts or {}
    return Choice(
        entry,
        tuple(
            verdict(entry, v, topo, converted=v.name in converted, numa_count=counts.get(v.name))
            for v in entry.variants
        ),
    )
