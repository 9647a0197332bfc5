"""Doctor's verdicts on the machine alone: the CPU's ISA and cores, the NUMA nodes' memory
and hugepages, the GPUs nvidia-smi sees.

They are pure functions of a :class:`~ktd.core.topology.Topology` and need no config:
the local doctor with no config yet runs only these (the first-day state), and every
other report starts with them. The checks of a model entry and of the engines'
interpreter need the config and the probe, and live in ``ktd.core.doctor``, which
gathers both.
"""

from __future__ import annotations

from ktd.core.topology import NumaNode, Topology, format_cpulist
from ktd.core.verdict import Check

__all__ = ["cpu_checks", "gpu_checks", "numa_checks"]

_GIB_KB = 1024 * 1024


def _gib(kb: int) -> str:
    return f"{kb / _GIB_KB:.1f} GiB"


# ---------------------------------------------------------------- CPU


def cpu_checks(topo: Topology) -> list[Check]:
    """ISA verdict and the kt-kernel build/method it implies, then the cores."""
    return [*_isa_checks(topo), _cores_check(topo)]


def _isa_checks(topo: Topology) -> list[Check]:
    """Which kt-kernel build loads here and which ``--kt-method``s can run."""
    isa = topo.isa()
    model = topo.cpu_model or "unknown CPU"
    variant = topo.kt_variant()
    extras = topo.isa_extras()
    extra_txt = f" (+{', '.join(extras)})" if extras else ""
    variant_txt = f"; kt-kernel loads its {variant} build" if variant else ""
    checks: list[Check] = []
    if isa == "amx":
        checks.append(
            Check(
                "cpu.isa",
                "ok",
                f"{model}: AMX (amx_tile, amx_int8, amx_bf16){extra_txt}{variant_txt}; "
                "AMX methods AMXINT4 (default) and AMXINT8 run here",
            )
        )
        if variant != "amx":
            checks.append(
                Check(
                    "cpu.amx_variant",
                    "warn",
                    f"AMX flags present but not the full AVX-512 set kt-kernel requires "
                    f"for its amx build; it will load {variant}",
                    "check the hypervisor's CPU model passes through every AVX-512 extension",
                )
            )
    elif isa == "avx512":
        checks.append(
            Check(
                "cpu.isa",
                "ok",
                f"{model}: AVX-512{extra_txt}, no AMX{variant_txt}; AMX methods "
                "(AMXINT4, the default, and AMXINT8) cannot run: use a non-AMX --kt-method "
                "such as LLAMAFILE (GGUF weights) or RAWINT4",
            )
        )
    elif isa == "avx2":
        checks.append(
            Check(
                "cpu.isa",
                "warn",
                f"{model}: AVX2 only (no AVX-512, no AMX){variant_txt}; experts run slowly",
                "expect low tokens/s; use a non-AMX --kt-method (e.g. LLAMAFILE with GGUF weights)",
            )
        )
    else:
        checks.append(
            Check(
                "cpu.isa",
                "fail",
                f"{model}: no AVX2; kt-kernel has no build for this CPU (illegal instruction)",
                "run on an x86-64 CPU with at least AVX2 (AMX for full speed)",
            )
        )
    return checks


def _cores_check(topo: Topology) -> Check:
    """Sockets, physical cores and online CPUs (none found: /sys is not what it should be)."""
    cpus = topo.cpus
    cores = topo.physical_cores(cpus)
    smt = len(cpus) // len(cores) if cores else 0
    return Check(
        "cpu.cores",
        "ok" if cores else "fail",
        f"{len(topo.packages)} socket(s), {len(cores)} physical cores, {len(cpus)} online "
        f"CPUs" + (f" ({smt} threads per core)" if smt > 1 else ""),
        "" if cores else "no online CPU was found under /sys; is /sys mounted?",
    )


# ---------------------------------------------------------------- NUMA


def numa_checks(topo: Topology) -> list[Check]:
    """NUMA layout, free RAM per node, and 2 MiB hugepage reservations."""
    checks = _layout_checks(topo)
    checks += [_memory_check(n) for n in topo.nodes]
    checks += [_hugepages_check(n) for n in topo.nodes if n.hugepages_total]
    if not any(n.hugepages_total for n in topo.nodes):
        checks.append(Check("numa.hugepages", "ok", "no 2 MiB hugepages reserved"))
    return checks


def _layout_checks(topo: Topology) -> list[Check]:
    """The nodes, and whether a multi-socket machine shows them (NUMA on in the BIOS)."""
    cpu_nodes = [n for n in topo.nodes if n.cpus]
    layout = "; ".join(
        f"node{n.id}: CPUs {format_cpulist(n.cpus) or '-'} "
        f"({len(topo.physical_cores(n.cpus))} cores), {_gib(n.mem_total_kb)}"
        for n in topo.nodes
    )
    sockets = len(topo.packages)
    if sockets > 1 and len(cpu_nodes) == 1:
        checks = [
            Check(
                "numa.layout",
                "warn",
                f"{sockets} sockets but one NUMA node: {layout}",
                "enable NUMA in the BIOS (disable node interleaving) so kt-kernel can keep "
                "each thread pool's experts in its own socket's memory",
            )
        ]
    else:
        checks = [Check("numa.layout", "ok", f"{len(topo.nodes)} node(s): {layout}")]
    memless = [n.id for n in topo.nodes if not n.cpus]
    if memless:
        checks.append(
            Check(
                "numa.cpuless",
                "ok",
                f"node(s) {format_cpulist(memless)} have memory but no CPUs "
                "(CXL/HBM); placement never puts a thread pool there",
            )
        )
    return checks


def _memory_check(n: NumaNode) -> Check:
    name = f"numa.node{n.id}.memory"
    if n.mem_total_kb <= 0:
        return Check(
            name, "warn", "memory size unknown (meminfo unreadable)", "check /sys is mounted"
        )
    frac = n.mem_free_kb / n.mem_total_kb
    detail = f"{_gib(n.mem_free_kb)} free of {_gib(n.mem_total_kb)}"
    if frac < 0.10:
        return Check(
            name,
            "warn",
            f"{detail} ({frac:.0%})",
            "little free RAM: another engine or job uses this node (page cache "
            "is counted as used and is reclaimed on demand)",
        )
    return Check(name, "ok", detail)


def _hugepages_check(n: NumaNode) -> Check:
    name = f"numa.node{n.id}.hugepages"
    reserved_kb = n.hugepages_total * 2048
    free_kb = n.hugepages_free * 2048
    detail = (
        f"{n.hugepages_total} x 2 MiB hugepages reserved ({_gib(reserved_kb)}), "
        f"{n.hugepages_free} free"
    )
    if n.mem_total_kb and free_kb > n.mem_total_kb * 0.25:
        return Check(
            name,
            "warn",
            detail,
            f"{_gib(free_kb)} of unused hugepages is RAM ordinary allocations "
            f"(kt-kernel's expert weights) cannot use; lower vm.nr_hugepages",
        )
    return Check(name, "ok", detail)


# ---------------------------------------------------------------- GPU


def gpu_checks(topo: Topology) -> list[Check]:
    """Which GPUs nvidia-smi sees; kt runs attention and the dense trunk there."""
    if not topo.gpus:
        return [
            Check(
                "gpu",
                "warn",
                f"no GPU found: {topo.gpu_error}" if topo.gpu_error else "no GPU found",
                "kt engines need a CUDA GPU for attention; install the NVIDIA driver, or "
                "list the GPUs in the model's gpus field if nvidia-smi cannot see them",
            )
        ]
    checks: list[Check] = []
    for g in topo.gpus:
        detail = f"{g.name}, {g.memory_total_mib} MiB, {g.memory_used_mib} MiB used"
        if g.memory_total_mib and g.memory_used_mib > g.memory_total_mib * 0.5:
            checks.append(
                Check(
                    f"gpu{g.index}",
                    "warn",
                    detail,
                    "more than half the VRAM is in use (another process, or a loaded engine)",
                )
            )
        else:
            checks.append(Check(f"gpu{g.index}", "ok", detail))
    return checks
