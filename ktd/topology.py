"""Machine topology, read from sysfs/procfs and ``nvidia-smi`` (the values and their
parsers are pure: ``ktd.core.topology``).

Reading is a function of a filesystem root plus one injectable ``nvidia-smi``
runner, so tests build fake machines in a tmp dir (a 2-socket Xeon, a 4-node
EPYC) and placement can be reasoned about without the hardware. Reading never
raises for a missing or odd file: a daemon that refuses to start because ``/sys``
looks unusual is worse than one that places engines on a best-effort view and
lets ``ktctl doctor`` say what it could not read.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from ktd.core.topology import (
    NVIDIA_SMI_QUERY,
    NVIDIA_SMI_TIMEOUT,
    Gpu,
    NumaNode,
    Topology,
    parse_cpulist,
    parse_nvidia_smi,
)

# The values and their parsers are ``ktd.core.topology``'s, imported from there: this
# module reads them.
__all__ = ["read_topology"]


RunFn = Callable[..., "subprocess.CompletedProcess[str]"]


def _probe_gpus(nvidia_smi: Sequence[str], run: RunFn) -> tuple[tuple[Gpu, ...], str | None]:
    cmd = [*nvidia_smi, *NVIDIA_SMI_QUERY]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except FileNotFoundError:
        return (), f"{nvidia_smi[0]} not found (no NVIDIA driver installed?)"
    except subprocess.TimeoutExpired:
        return (), f"{nvidia_smi[0]} did not answer within {NVIDIA_SMI_TIMEOUT:g}s"
    except (OSError, subprocess.SubprocessError) as exc:
        return (), f"{nvidia_smi[0]} could not run: {exc}"
    out = proc.stdout if isinstance(proc.stdout, str) else ""
    if proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else ""
        msg = (err.strip() or out.strip() or "no output").splitlines()[0]
        return (), f"{nvidia_smi[0]} exited with {proc.returncode}: {msg}"
    try:
        gpus = parse_nvidia_smi(out)
    except ValueError as exc:
        return (), f"cannot parse {nvidia_smi[0]} output: {exc}"
    if not gpus:
        return (), f"{nvidia_smi[0]} listed no GPUs"
    return gpus, None


# ---------------------------------------------------------------- sysfs / procfs


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _cpuinfo(text: str) -> tuple[str, frozenset[str], dict[int, tuple[int, int]]]:
    """Model name, flags of the first CPU, and per-processor (physical id, core id) if given."""
    model = ""
    flags: frozenset[str] | None = None
    cores: dict[int, tuple[int, int]] = {}
    for block in re.split(r"\n\s*\n", text):
        kv: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                kv.setdefault(key.strip().lower(), value.strip())
        if not model:
            model = kv.get("model name") or kv.get("hardware") or kv.get("cpu model") or ""
        if flags is None and ("flags" in kv or "features" in kv):
            flags = frozenset((kv.get("flags") or kv.get("features") or "").lower().split())
        try:
            proc = int(kv["processor"])
            cores[proc] = (int(kv["physical id"]), int(kv["core id"]))
        except (KeyError, ValueError):
            pass
    return model, flags or frozenset(), cores


def _online_cpus(
    sysdir: Path, cpuinfo_cores: Mapping[int, tuple[int, int]], text: str
) -> list[int]:
    online = _read(sysdir / "cpu" / "online")
    if online is not None:
        try:
            return parse_cpulist(online)
        except ValueError:
            pass
    # No (readable) online mask: every cpuN directory whose own ``online`` is not 0
    # (cpu0 usually has no ``online`` file because it cannot be offlined).
    found: list[int] = []
    try:
        entries = list((sysdir / "cpu").iterdir())
    except OSError:
        entries = []
    for entry in entries:
        m = re.fullmatch(r"cpu(\d+)", entry.name)
        if m and _read_int(entry / "online") != 0:
            found.append(int(m[1]))
    if found:
        return sorted(found)
    procs = [int(m) for m in re.findall(r"^processor\s*:\s*(\d+)", text, re.M)]
    return sorted(set(procs) | set(cpuinfo_cores))


def _meminfo_kb(text: str | None, key: str) -> int:
    """``Node 0 MemFree:  123 kB`` (per node) or ``MemFree:  123 kB`` (/proc/meminfo)."""
    if not text:
        return 0
    m = re.search(rf"^(?:Node \d+ )?{key}:\s*(\d+)", text, re.M)
    return int(m[1]) if m else 0


def _available_kb(text: str | None) -> int:
    """A per-node MemAvailable (the kernel gives one only machine-wide): free + file pages
    not in shmem + reclaimable slab."""
    if not text:
        return 0
    if re.search(r"^MemAvailable:", text, re.M):
        return _meminfo_kb(text, "MemAvailable")
    file_pages = max(0, _meminfo_kb(text, "FilePages") - _meminfo_kb(text, "Shmem"))
    return _meminfo_kb(text, "MemFree") + file_pages + _meminfo_kb(text, "SReclaimable")


def _hugepages(dir_: Path) -> tuple[int, int]:
    total = _read_int(dir_ / "nr_hugepages") or 0
    free = _read_int(dir_ / "free_hugepages") or 0
    return total, free


def read_topology(
    root: Path = Path("/"),
    *,
    nvidia_smi: Sequence[str] | None = ("nvidia-smi",),
    run: RunFn = subprocess.run,
) -> Topology:
    """Read the machine under ``root`` (``/`` in production, a fixture dir in tests).

    Never raises for missing files: a machine without ``node*`` directories
    (NUMA off in the BIOS, many VMs and containers) is one node 0 holding every
    online CPU, with memory from ``/proc/meminfo``. Offline CPUs are the only
    ones left out. ``nvidia_smi=None`` skips the GPU probe (gpus=(), no error).
    """
    root = Path(root)
    sysdir = root / "sys" / "devices" / "system"
    cpuinfo_text = _read(root / "proc" / "cpuinfo") or ""
    model, flags, cpuinfo_cores = _cpuinfo(cpuinfo_text)
    online = _online_cpus(sysdir, cpuinfo_cores, cpuinfo_text)
    core_of = _cores(sysdir, online, cpuinfo_cores)
    nodes = _nodes(sysdir, set(online))
    if not nodes:  # no NUMA in sysfs: one node 0 with every online CPU and all memory
        huge = root / "sys" / "kernel" / "mm" / "hugepages" / "hugepages-2048kB"
        nodes = [_node(0, online, _read(root / "proc" / "meminfo"), huge)]

    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None
    if nvidia_smi is not None and len(nvidia_smi) > 0:
        gpus, gpu_error = _probe_gpus(nvidia_smi, run)

    return Topology(
        nodes=tuple(nodes),
        cpu_model=model,
        flags=flags,
        core_of=MappingProxyType(core_of),
        gpus=gpus,
        gpu_error=gpu_error,
    )


def _cores(
    sysdir: Path, online: Sequence[int], cpuinfo_cores: dict[int, tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """(package, core) of each online CPU: sysfs's topology, else ``/proc/cpuinfo``'s."""
    core_of: dict[int, tuple[int, int]] = {}
    for cpu in online:
        tdir = sysdir / "cpu" / f"cpu{cpu}" / "topology"
        pkg = _read_int(tdir / "physical_package_id")
        core = _read_int(tdir / "core_id")
        if pkg is not None and core is not None:
            core_of[cpu] = (pkg, core)
        elif cpu in cpuinfo_cores:
            core_of[cpu] = cpuinfo_cores[cpu]
    return core_of


def _nodes(sysdir: Path, online: set[int]) -> list[NumaNode]:
    """The ``node*`` directories of sysfs, in order, each with its online CPUs."""
    node_dirs: list[tuple[int, Path]] = []
    try:
        for entry in (sysdir / "node").iterdir():
            m = re.fullmatch(r"node(\d+)", entry.name)
            if m and entry.is_dir():
                node_dirs.append((int(m[1]), entry))
    except OSError:
        pass
    nodes = []
    for nid, ndir in sorted(node_dirs):
        try:
            cpus = parse_cpulist(_read(ndir / "cpulist") or "")
        except ValueError:
            cpus = []
        mine = [c for c in cpus if c in online]
        huge = ndir / "hugepages" / "hugepages-2048kB"
        nodes.append(_node(nid, mine, _read(ndir / "meminfo"), huge))
    return nodes


def _node(nid: int, cpus: Sequence[int], meminfo: str | None, hugepages: Path) -> NumaNode:
    """One node: its CPUs, its memory (a ``meminfo`` text), its 2 MiB huge pages."""
    hp_total, hp_free = _hugepages(hugepages)
    return NumaNode(
        id=nid,
        cpus=tuple(cpus),
        mem_total_kb=_meminfo_kb(meminfo, "MemTotal"),
        mem_free_kb=_meminfo_kb(meminfo, "MemFree"),
        hugepages_total=hp_total,
        hugepages_free=hp_free,
        mem_available_kb=_available_kb(meminfo),
    )
