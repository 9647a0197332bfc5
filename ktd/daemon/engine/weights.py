"""Sizes read from a model's files, for the memory estimate (the I/O beside ``ktd.core.fit``).

Apparent sizes (``st_size``), not allocated blocks: what a load reads into RAM
is the file's length, and tests stand sparse files in for hundreds of GB.
Safetensors headers (8-byte length + JSON) give the exact bytes of every
tensor without reading the data, so expert and non-expert weights separate.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ktd import foreign
from ktd.core import fit
from ktd.core.config import ModelSpec
from ktd.core.placement import tp_size_of
from ktd.core.topology import Topology
from ktd.core.userflags import user_flags
from ktd.daemon.engine.preflight import read_model_config

__all__ = [
    "Occupant",
    "Split",
    "apparent_size",
    "estimate_spec",
    "non_expert_bytes",
    "weight_split",
]

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


#: Weights every tensor-parallel rank keeps whole (not sharded by SGLang's parallel
#: linear layers): the MoE router and MLA's down projections (``ReplicatedLinear`` in
#: SGLang's DeepSeek model), and every 1-D tensor (norms, biases).
_REPLICATED = (".mlp.gate.weight", "q_a_proj", "kv_a_proj_with_mqa", "e_score_correction")


def _is_replicated(name: str, shape: object) -> bool:
    if any(part in name for part in _REPLICATED):
        return True
    return isinstance(shape, list) and len(shape) <= 1


def _header(path: Path) -> dict[str, object] | None:
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or n > _MAX_HEADER:
                return None
            data = foreign.loads(f.read(n))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Split:
    """A model's safetensors by where SGLang and kt-kernel put them: the non-expert
    weights (``replicated`` of them kept whole by every tensor-parallel rank) and the
    routed experts (at ``model_path``'s precision)."""

    dense: int
    replicated: int
    experts: int


def weight_split(model_path: str) -> Split | None:
    """``model_path``'s tensors by kind, from the safetensors headers; None if none."""
    p = Path(model_path)
    try:
        shards = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    except OSError:
        return None
    dense = replicated = experts = 0
    seen = False
    for shard in shards:
        header = _header(shard)
        if header is None:
            continue
        for name, meta in header.items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            offsets = meta.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2):
                continue
            size = int(offsets[1]) - int(offsets[0])
            seen = True
            if _is_expert(name):
                experts += size
            else:
                dense += size
                if _is_replicated(name, meta.get("shape")):
                    replicated += size
    return Split(dense, replicated, experts) if seen else None


def non_expert_bytes(model_path: str) -> int | None:
    """Bytes of the non-expert tensors of ``model_path``'s safetensors, or None if none."""
    split = weight_split(model_path)
    return None if split is None else split.dense


def _gpu_experts(spec: ModelSpec) -> int:
    """``--kt-num-gpu-experts`` from extra_args (per layer; 0 when unset)."""
    values = user_flags(spec.extra_args).get("--kt-num-gpu-experts") or ()
    return int(values[-1]) if values and values[-1].isdigit() else 0


def estimate_spec(spec: ModelSpec) -> fit.Estimate:
    """The memory estimate of one model (blocking: run it in a thread)."""
    cfg, _ = read_model_config(spec.path)
    experts = apparent_size(spec.kt_weight_path) if spec.kt_weight_path else None
    split = weight_split(spec.path)
    return fit.estimate(
        expert_bytes=experts,
        dense_bytes=split.dense if split else None,
        model_config=cfg,
        ctx=spec.ctx,
        replicated_bytes=split.replicated if split else 0,
        tp=tp_size_of(spec.tp_size, user_flags(spec.extra_args)) or 1,
        gpu_experts=_gpu_experts(spec),
        routed_expert_bytes=split.experts if split else None,
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


@dataclass(frozen=True)
class Occupant:
    """An engine a fit counts: its model, where it runs, whether it holds the host copy
    of its GPU weights already, and what it keeps on its GPUs asleep (measured)."""

    spec: ModelSpec
    nodes: tuple[int, ...]
    gpus: tuple[int, ...]
    backed_up: bool = False
    residue: Mapping[int, int] | None = None
    asleep: bool = False

    def holder(self) -> fit.Resident:
        est = estimate_spec(self.spec)
        return fit.Resident(est, self.nodes, self.gpus, self.backed_up, self.residue, self.asleep)


def verdict(
    spec: ModelSpec,
    numa_nodes: tuple[int, ...],
    gpus: tuple[int, ...],
    victims: list[Occupant],
    evicting: tuple[str, ...],
    sleepers: list[Occupant] | None = None,
    waker: Occupant | None = None,
) -> tuple[fit.Estimate, fit.Fit]:
    """Estimate ``spec`` and check it against free memory plus what ``victims`` free
    and ``sleepers`` (victims that go to sleep) free and take; for a wake (``waker``:
    ``spec``'s own engine, asleep) only what its residue does not cover (blocking:
    files and nvidia-smi; run it in a thread)."""
    est = estimate_spec(spec)
    need = est if waker is None else fit.to_wake(waker.holder())
    node_free, gpu_free = free_memory()
    freed = fit.freed_by([v.holder() for v in victims], [v.holder() for v in sleepers or ()])
    result = fit.check(
        need,
        node_free=node_free,
        numa_nodes=numa_nodes,
        gpu_free=gpu_free,
        gpus=gpus,
        freed=freed,
        evicting=evicting,
        sleeping=tuple(v.spec.alias for v in sleepers or ()),
    )
    return est, result
