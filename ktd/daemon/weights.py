"""Sizes read from a model's files, for the memory estimate (the I/O beside ``ktd.core.fit``).

Apparent sizes (``st_size``), not allocated blocks: what a load reads into RAM
is the file's length, and tests stand sparse files in for hundreds of GB.
Safetensors headers (8-byte length + JSON) give the exact bytes of every
tensor without reading the data, so expert and non-expert weights separate.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from ktd.core import fit
from ktd.core.config import ModelSpec
from ktd.core.topology import Topology
from ktd.daemon.preflight import read_model_config

__all__ = ["apparent_size", "estimate_spec", "non_expert_bytes"]

_MAX_HEADER = 100 << 20


def apparent_size(path: str) -> int | None:
    """Sum of regular files' sizes under ``path`` (or its own size); None if unreadable."""
    p = Path(path)
    try:
        if p.is_file():
            return p.stat().st_size
        if not p.is_dir():
            return None
    except OSError:
        return None
    total = 0
    for dirpath, _dirs, files in os.walk(p):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name), follow_symlinks=True)
            except OSError:
                continue
            total += st.st_size
    return total


def _is_expert(name: str) -> bool:
    """Routed experts live on the CPU in kt; shared experts and routers stay on the GPU."""
    return ".experts." in name and "shared_expert" not in name


def _header(path: Path) -> dict[str, object] | None:
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or n > _MAX_HEADER:
                return None
            data = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def non_expert_bytes(model_path: str) -> int | None:
    """Bytes of the non-expert tensors of ``model_path``'s safetensors, or None if none."""
    p = Path(model_path)
    try:
        shards = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    except OSError:
        return None
    total = 0
    seen = False
    for shard in shards:
        header = _header(shard)
        if header is None:
            continue
        for name, meta in header.items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            offsets = meta.get("data_offsets")
            if isinstance(offsets, list) and len(offsets) == 2 and not _is_expert(name):
                total += int(offsets[1]) - int(offsets[0])
                seen = True
    return total if seen else None


def estimate_spec(spec: ModelSpec) -> fit.Estimate:
    """The memory estimate of one model (blocking: run it in a thread)."""
    cfg, _ = read_model_config(spec.path)
    experts = apparent_size(spec.kt_weight_path) if spec.kt_weight_path else None
    return fit.estimate(
        expert_bytes=experts,
        dense_bytes=non_expert_bytes(spec.path),
        model_config=cfg,
        ctx=spec.ctx,
    )


# ---------------------------------------------------------------- free memory and the verdict


def machine_root() -> Path:
    """Where sysfs/procfs are read: ``$KTD_SYSFS_ROOT`` (tests, containers) or ``/``."""
    return Path(os.environ.get("KTD_SYSFS_ROOT") or "/")


def nvidia_smi_cmd() -> tuple[str, ...] | None:
    """``$KTD_NVIDIA_SMI`` (a command; empty = no GPUs) or ``nvidia-smi``."""
    import shlex

    raw = os.environ.get("KTD_NVIDIA_SMI")
    if raw is None:
        return ("nvidia-smi",)
    words = tuple(shlex.split(raw))
    return words or None


def read_machine() -> Topology:
    """The machine as the daemon places on it: ``$KTD_SYSFS_ROOT`` and ``$KTD_NVIDIA_SMI``
    (blocking: nvidia-smi runs; call it in a thread from trio)."""
    from ktd.topology import read_topology

    return read_topology(machine_root(), nvidia_smi=nvidia_smi_cmd())


def free_memory() -> tuple[dict[int, int], dict[int, int] | None]:
    """(available bytes per NUMA node, free bytes per GPU or None when unreadable)."""
    topo = read_machine()
    nodes = {n.id: n.available_kb * 1024 for n in topo.nodes}
    if not topo.gpus:
        return nodes, None
    gpus = {g.index: max(0, g.memory_total_mib - g.memory_used_mib) * fit.MIB for g in topo.gpus}
    return nodes, gpus


def verdict(
    spec: ModelSpec,
    numa_nodes: tuple[int, ...],
    gpus: tuple[int, ...],
    victims: list[tuple[ModelSpec, tuple[int, ...], tuple[int, ...]]],
    evicting: tuple[str, ...],
    sleepers: list[tuple[ModelSpec, tuple[int, ...], tuple[int, ...]]] | None = None,
) -> tuple[fit.Estimate, fit.Fit]:
    """Estimate ``spec`` and check it against free memory plus what ``victims`` free
    and ``sleepers`` (victims that go to sleep) free and take (blocking: files and
    nvidia-smi; run it in a thread)."""
    est = estimate_spec(spec)
    node_free, gpu_free = free_memory()
    freed = fit.freed_by(
        [(estimate_spec(v), n, g) for v, n, g in victims],
        [(estimate_spec(v), n, g) for v, n, g in sleepers or ()],
    )
    result = fit.check(
        est,
        node_free=node_free,
        numa_nodes=numa_nodes,
        gpu_free=gpu_free,
        gpus=gpus,
        freed=freed,
        evicting=evicting,
    )
    return est, result
