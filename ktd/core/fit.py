"""Memory fit: does a model fit in what its planned NUMA nodes and GPUs have free?

kt-kernel holds every expert in host RAM whatever the GPU expert count
(ktransformers #2084), and the commonest failed load is an out-of-memory one
minutes in. So a load is refused, before anything is evicted, when the
estimate does not fit. Pure: a function of the sizes read from disk
(``ktd.daemon.engine.weights``), the model's ``config.json``, and free memory; evictions the
plan would make count as freed.

The estimate:

* host RAM = the apparent size of ``kt_weight_path`` (the converted experts);
  AMX weights are split per NUMA node at conversion, so each planned node
  needs its share;
* GPU memory = the weights the GPUs hold, over every tensor-parallel rank: the
  non-expert weights (from the safetensors headers of ``model_path``, else from
  ``config.json``), sharded over the ranks except those every rank keeps whole (norms,
  biases, routers, MLA's down projections: ``replicated_bytes``), plus the routed
  experts kept on the GPU (``--kt-num-gpu-experts`` of each layer's ``n_routed_experts``:
  kt-kernel holds every expert in host RAM all the same); and the KV cache for ``ctx``
  (layers x KV heads x head dim x dtype, or the MLA latent for DeepSeek); split over the
  planned GPUs.

Sleep adds host memory (``docs/sglang.md``, "Sleep"): ``--enable-weights-cpu-backup``
copies the GPU weights into pinned host memory at the first release, and
torch_memory_saver (0.0.9, which the kt fork pins) keeps that copy after the resume: an
engine that has slept once (``backed_up``) holds experts + that copy, awake or asleep.
An asleep engine still holds GPU memory too: the CUDA context, buffers outside the
saver's regions, and the CUDA graphs unless ``SGLANG_MEMORY_SAVER_CUDA_GRAPH`` is set
(ktd sets it): its ``residue``, measured by nvidia-smi after the release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RESIDUE_GUESS",
    "Estimate",
    "Fit",
    "Freed",
    "Resident",
    "check",
    "estimate",
    "freed_by",
    "gib",
    "gpu_weights",
    "host_held",
    "kv_cache_bytes",
    "to_wake",
]

GIB = 1 << 30
MIB = 1 << 20

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
}


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs nest the language model's fields under ``text_config``."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, Mapping) and "num_hidden_layers" in inner else cfg


def dtype_bytes(cfg: Mapping[str, Any]) -> int:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    return _DTYPE_BYTES.get(str(raw).removeprefix("torch."), 2)


def kv_cache_bytes(cfg: Mapping[str, Any], ctx: int) -> int | None:
    """KV cache for one sequence of ``ctx`` tokens, or None when the config says too little."""
    c = _text_config(cfg)
    layers = _int(c, "num_hidden_layers", "n_layer", "num_layers")
    if layers is None or ctx <= 0:
        return None
    size = dtype_bytes(c)
    lora = _int(c, "kv_lora_rank")
    if lora is not None:  # MLA (DeepSeek): one latent + the rope part per token and layer
        return layers * ctx * (lora + (_int(c, "qk_rope_head_dim") or 0)) * size
    heads = _int(c, "num_attention_heads", "n_head")
    kv_heads = _int(c, "num_key_value_heads") or heads
    hidden = _int(c, "hidden_size", "n_embd")
    head_dim = _int(c, "head_dim") or (hidden // heads if hidden and heads else None)
    if kv_heads is None or head_dim is None:
        return None
    return 2 * layers * ctx * kv_heads * head_dim * size


def dense_bytes_from_config(cfg: Mapping[str, Any]) -> int | None:
    """Non-expert weights estimated from the shapes (embeddings, attention, dense MLPs,
    shared experts, routers). Only used when no safetensors header says it exactly."""
    c = _text_config(cfg)
    hidden = _int(c, "hidden_size")
    layers = _int(c, "num_hidden_layers")
    vocab = _int(c, "vocab_size")
    if hidden is None or layers is None or vocab is None:
        return None
    heads = _int(c, "num_attention_heads") or 1
    kv_heads = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or hidden // heads
    experts = _int(c, "n_routed_experts", "num_experts", "num_local_experts")
    inter = _int(c, "intermediate_size") or 4 * hidden
    moe_inter = _int(c, "moe_intermediate_size") or inter
    shared = _int(c, "n_shared_experts") or (1 if _int(c, "shared_expert_intermediate_size") else 0)
    dense_layers = layers if experts is None else min(layers, _int(c, "first_k_dense_replace") or 0)
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_moe_layer = 3 * hidden * moe_inter * shared + hidden * (experts or 0)
    params = (
        embed
        + layers * attn
        + dense_layers * 3 * hidden * inter
        + (layers - dense_layers) * per_moe_layer
    )
    return params * dtype_bytes(c)


#: The GPU memory an asleep engine is taken to keep per GPU until nvidia-smi has measured
#: it (the CUDA context and what lives outside the saver's regions).
RESIDUE_GUESS = 1 * GIB


@dataclass(frozen=True)
class Estimate:
    """What one load needs; ``None`` parts are unknown (and not checked).
    ``gpu_weights_bytes``: over every tensor-parallel rank (what the host copy of a
    sleep holds too)."""

    host_bytes: int | None
    gpu_weights_bytes: int | None
    kv_bytes: int | None
    ctx: int = 0
    notes: tuple[str, ...] = ()

    @property
    def gpu_bytes(self) -> int | None:
        if self.gpu_weights_bytes is None and self.kv_bytes is None:
            return None
        return (self.gpu_weights_bytes or 0) + (self.kv_bytes or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_bytes": self.host_bytes,
            "gpu_bytes": self.gpu_bytes,
            "gpu_weights_bytes": self.gpu_weights_bytes,
            "kv_cache_bytes": self.kv_bytes,
            "ctx": self.ctx,
            "notes": list(self.notes),
        }


def gpu_weights(
    dense: int,
    *,
    replicated: int = 0,
    tp: int = 1,
    routed_expert_bytes: int | None = None,
    gpu_experts: int = 0,
    routed_experts: int | None = None,
) -> int:
    """The weights the GPUs hold over every rank: the non-expert weights sharded over
    ``tp`` ranks but for ``replicated`` bytes each rank keeps whole, plus ``gpu_experts``
    of each layer's ``routed_experts`` (sharded like the rest)."""
    tp = max(tp, 1)
    total = dense + max(replicated, 0) * (tp - 1)
    if gpu_experts > 0 and routed_expert_bytes and routed_experts:
        total += routed_expert_bytes * min(gpu_experts, routed_experts) // routed_experts
    return total


def estimate(
    *,
    expert_bytes: int | None,
    dense_bytes: int | None,
    model_config: Mapping[str, Any] | None,
    ctx: int,
    replicated_bytes: int = 0,
    tp: int = 1,
    gpu_experts: int = 0,
    routed_expert_bytes: int | None = None,
) -> Estimate:
    """Combine what was read from disk into an :class:`Estimate`.

    ``ctx`` 0 means SGLang's default, the model's ``max_position_embeddings``.
    """
    notes: list[str] = []
    cfg = model_config or {}
    if not ctx:
        ctx = _int(_text_config(cfg), "max_position_embeddings") or 0
    if dense_bytes is None and model_config is not None:
        dense_bytes = dense_bytes_from_config(model_config)
        if dense_bytes is not None:
            notes.append("GPU weights estimated from config.json shapes")
    if dense_bytes is not None:
        routed = _int(_text_config(cfg), "n_routed_experts", "num_experts", "num_local_experts")
        dense_bytes = gpu_weights(
            dense_bytes,
            replicated=replicated_bytes,
            tp=tp,
            routed_expert_bytes=routed_expert_bytes,
            gpu_experts=gpu_experts,
            routed_experts=routed,
        )
        if gpu_experts and not (routed_expert_bytes and routed):
            notes.append("GPU experts (--kt-num-gpu-experts) not counted: sizes unknown")
    kv = kv_cache_bytes(cfg, ctx) if model_config is not None else None
    if expert_bytes is None:
        notes.append("no kt_weight_path: host RAM not estimated")
    if model_config is None:
        notes.append("no readable config.json: GPU memory not estimated")
    return Estimate(expert_bytes, dense_bytes, kv, ctx, tuple(notes))


@dataclass(frozen=True)
class Freed:
    """Memory an eviction gives back: per node / per GPU, and node-less host RAM."""

    host_by_node: Mapping[int, int] = field(default_factory=dict)
    host_anywhere: int = 0
    gpu_by_index: Mapping[int, int] = field(default_factory=dict)


def host_held(est: Estimate, *, backed_up: bool) -> int | None:
    """Host RAM an engine holds: its experts (kt-kernel keeps them, awake or asleep),
    plus, once it has slept in this run (``backed_up``), the pinned host copy of its GPU
    weights (``--enable-weights-cpu-backup``, kept after a resume)."""
    copy = est.gpu_weights_bytes if backed_up else None
    if est.host_bytes is None and copy is None:
        return None
    return (est.host_bytes or 0) + (copy or 0)


@dataclass(frozen=True)
class Resident:
    """An engine whose memory a fit counts as freed or taken: its estimate, where it
    runs, whether it holds the host copy already (``backed_up``) and what it keeps on
    each GPU asleep (``residue``: measured, else ``RESIDUE_GUESS``)."""

    est: Estimate
    nodes: Sequence[int]
    gpus: Sequence[int]
    backed_up: bool = False
    residue: Mapping[int, int] | None = None
    asleep: bool = False  # holds its residue alone on its GPUs (and its host memory)

    def kept_on(self, gpu: int) -> int:
        return (self.residue or {}).get(gpu, RESIDUE_GUESS)

    def on_gpu(self, gpu: int) -> int:
        """What it holds on ``gpu`` now (a share of its estimate, or asleep its residue)."""
        if self.asleep:
            return self.kept_on(gpu)
        g = self.est.gpu_bytes
        return g // len(self.gpus) if g and self.gpus else 0


def freed_by(victims: Sequence[Resident], sleepers: Sequence[Resident] = ()) -> Freed:
    """Sum what evicting ``victims`` frees, split like loads: their GPU memory, their
    experts and (if they have one) the host copy of their GPU weights. ``sleepers`` go
    to sleep instead: they free their GPU memory but their residue, and *take* host RAM
    for the copy of their GPU weights unless they hold it already; their experts stay."""
    host: dict[int, int] = {}
    anywhere = 0
    gpu: dict[int, int] = {}

    def add_host(nodes: Sequence[int], n: int) -> None:
        nonlocal anywhere
        if nodes:
            for node in nodes:
                host[node] = host.get(node, 0) + n // len(nodes)
        else:
            anywhere += n

    for v in victims:
        for i in v.gpus:
            gpu[i] = gpu.get(i, 0) + v.on_gpu(i)
        held = host_held(v.est, backed_up=v.backed_up or v.asleep)
        if held:
            add_host(v.nodes, held)
    for v in sleepers:
        g = v.est.gpu_bytes
        if g and v.gpus:
            for i in v.gpus:
                gpu[i] = gpu.get(i, 0) + max(0, g // len(v.gpus) - v.kept_on(i))
        if v.est.gpu_weights_bytes and not v.backed_up:
            add_host(v.nodes, -v.est.gpu_weights_bytes)
    return Freed(host, anywhere, gpu)


def to_wake(waker: Resident) -> Estimate:
    """What a wake asks of the machine: GPU memory for what its residue does not cover;
    no host memory (its experts and host copy are held already)."""
    est = waker.est
    if est.gpu_bytes is None or not waker.gpus:
        return Estimate(None, None, None, est.ctx, est.notes)
    per_gpu = est.gpu_bytes // len(waker.gpus)
    need = sum(max(0, per_gpu - waker.kept_on(i)) for i in waker.gpus)
    return Estimate(None, need, None, est.ctx, est.notes)


@dataclass(frozen=True)
class Fit:
    """The verdict. ``ok``: it fits. ``refuses``: a load with ``fit: check`` is refused
    (memory measured short). ``no_gpu``: it needs GPU memory and ktd sees no GPU: that
    does not fit, but alone it refuses nothing (issue 43: it said "fits"), since a CPU
    build of SGLang (``--device cpu``) and the simulated engine run without one; SGLang
    decides at launch."""

    ok: bool
    reason: str | None
    rows: tuple[dict[str, Any], ...] = ()  # one per node / GPU checked
    notes: tuple[str, ...] = ()
    no_gpu: bool = False
    short: bool = True  # not ok: memory measured short (False: no GPU alone)

    @property
    def refuses(self) -> bool:
        return not self.ok and self.short

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "rows": list(self.rows),
            "notes": list(self.notes),
            "no_gpu": self.no_gpu,
            "refuses": self.refuses,
        }


#: The row of a GPU need on a machine without a GPU (its ``free`` is 0).
NO_GPU_ROW = "GPU memory"


def no_gpu_reason(need: int) -> str:
    amount = gib(need) if need >= GIB // 10 else f"{need / MIB:.0f} MiB"
    return (
        f"does not fit: no GPU: it needs {amount} of GPU memory (weights + KV cache) "
        "and ktd sees no GPU on this machine"
    )


def check(
    est: Estimate,
    *,
    node_free: Mapping[int, int],
    numa_nodes: Sequence[int],
    gpu_free: Mapping[int, int] | None,
    gpus: Sequence[int],
    freed: Freed = Freed(),
    evicting: Sequence[str] = (),
    sleeping: Sequence[str] = (),
) -> Fit:
    """Compare ``est`` with free memory (bytes) of the planned nodes and GPUs.

    No planned nodes (``numa: none``): the whole machine's free RAM counts.
    ``gpu_free`` None: the GPUs could not be read, so GPU memory is not checked; with no
    planned GPU either, ktd sees no GPU at all: a GPU need does not fit (``Fit.no_gpu``).
    """
    table = _FitRows(freed)
    rows, short = table.rows, table.short
    notes: list[str] = []
    if est.host_bytes:
        table.host(est.host_bytes, node_free, numa_nodes)
    need_gpu = est.gpu_bytes
    no_gpu = bool(need_gpu) and gpu_free is None and not gpus
    if no_gpu:
        assert need_gpu is not None
        rows.append({"what": NO_GPU_ROW, "need": need_gpu, "free": 0})
    if need_gpu and gpus:
        if gpu_free is None:
            notes.append("GPU memory not checked (nvidia-smi unavailable)")
        else:
            table.gpu(need_gpu, gpu_free, gpus)
    if short:
        if no_gpu:
            short.append(f"no GPU for its {gib(need_gpu or 0)} of GPU memory")
        # Those of ``evicting`` put to sleep are said so (issue 43: "after evicting" them).
        stops = [a for a in evicting if a not in sleeping]
        done = [f"putting {', '.join(sleeping)} to sleep"] if sleeping else []
        done += [f"evicting {', '.join(stops)}"] if stops else []
        after = f" after {' and '.join(done)}" if done else ""
        reason = (
            "does not fit"
            + after
            + ": "
            + "; ".join(short)
            + ' (set "fit": "ignore" on the model to load anyway)'
        )
        return Fit(False, reason, tuple(rows), tuple(notes), no_gpu=no_gpu)
    if no_gpu:
        reason = no_gpu_reason(need_gpu or 0)
        return Fit(False, reason, tuple(rows), tuple(notes), no_gpu=True, short=False)
    return Fit(True, None, tuple(rows), tuple(notes))


class _FitRows:
    """The check's table as it is built: a row per node or GPU compared (its need, its
    free memory plus what the swap frees there), and a line for each one short."""

    def __init__(self, freed: Freed) -> None:
        self.freed = freed
        self.rows: list[dict[str, Any]] = []
        self.short: list[str] = []

    def _row(self, what: str, need: int, free: int, who: str, unit: str = "") -> None:
        self.rows.append({"what": what, "need": need, "free": free})
        if need > free:
            self.short.append(f"{who} needs {gib(need)}{unit}, has {gib(free)} free")

    def host(self, need: int, node_free: Mapping[int, int], numa_nodes: Sequence[int]) -> None:
        """Host RAM against each planned node's share (what the swap frees spread over
        every node), or against the whole machine's with no node planned (``numa: none``)."""
        freed = self.freed
        if not numa_nodes:
            have = sum(node_free.values()) + sum(freed.host_by_node.values())
            self._row("host RAM", need, have + freed.host_anywhere, "host", " RAM")
            return
        share = need // len(numa_nodes)
        spread = freed.host_anywhere // max(len(node_free), 1)
        for n in numa_nodes:
            have = node_free.get(n, 0) + freed.host_by_node.get(n, 0) + spread
            self._row(f"numa node {n}", share, have, f"NUMA node {n}", " RAM")

    def gpu(self, need: int, gpu_free: Mapping[int, int], gpus: Sequence[int]) -> None:
        """GPU memory against each planned GPU's equal share (what the swap frees there)."""
        share = need // len(gpus)
        for i in gpus:
            have = gpu_free.get(i, 0) + self.freed.gpu_by_index.get(i, 0)
            self._row(f"gpu {i}", share, have, f"GPU {i}")
