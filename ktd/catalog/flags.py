"""The launch flags worked out for this box, each with its origin and why. Pure.

Origins: ``catalog`` (the entry's and the variant's defaults, its parsers), ``derived``
(computed here from the weights, the CPU and the GPUs' free memory), ``user`` (the
operator's ``extra_args``: a user's flag always wins, however the catalog or the
arithmetic would have it). What is derived:

* ``--kt-method``: the chosen variant's (its weight format, and the CPU features it
  needs, which ``choose`` checked);
* for AMX weights (``AMXINT4``/``AMXINT8``), the NUMA count read from the weights against
  the pools the placement gives (``--kt-threadpool-count``): a mismatch is refused
  (kt-kernel splits AMX weights per NUMA pool at conversion; weights converted for
  another count crash it: ktransformers #2128);
* ``--kt-num-gpu-experts``: what the GPUs have free, less SGLang's own reserve
  (activations and CUDA graphs), the attention (non-expert) weights and the KV cache for
  the context, divided by what one expert per layer takes (the arithmetic is returned
  as text; see ``docs/catalog.md`` for each constant's source);
* ``--kt-cpuinfer``, ``--kt-threadpool-count``, ``--kt-numa-nodes``: as at every launch
  (``ktd.core.ktflags``), shown here, written nowhere (placement derives them afresh).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ktd.catalog.schema import Entry, Variant
from ktd.core import fit, ktflags
from ktd.core.topology import Gpu, Topology
from ktd.core.userflags import user_flags

__all__ = [
    "AMX_METHODS",
    "Derivation",
    "Flag",
    "Sizes",
    "derive",
    "gpu_experts",
    "sglang_reserve_mib",
]

AMX_METHODS = frozenset({"AMXINT4", "AMXINT8"})
GB = 1_000_000_000
MIB = 1 << 20
EXPERTS_FLAG = "--kt-num-gpu-experts"
METHOD_FLAG = "--kt-method"
#: What kt's registry reserves per GPU before the first GPU expert (attention, KV cache
#: and CUDA graphs in one figure): the fallback before config.json is here
#: (kt-kernel/python/cli/utils/model_registry.py, compute_*_gpu_experts: ``per_gpu_gb = 16``).
KT_REGISTRY_RESERVE_GB = 16

Origin = Literal["catalog", "derived", "user"]


@dataclass(frozen=True)
class Flag:
    name: str
    values: tuple[str, ...]
    origin: Origin
    why: str = ""

    def argv(self) -> list[str]:
        return [self.name, *self.values]

    def to_dict(self) -> dict[str, Any]:
        return {
            "flag": self.name,
            "values": list(self.values),
            "origin": self.origin,
            "why": self.why,
        }


@dataclass(frozen=True)
class Sizes:
    """Bytes read from the model's safetensors headers (``ktd.daemon.engine.weights.weight_split``):
    non-expert weights (``replicated`` of them kept whole by every TP rank), routed experts."""

    dense: int
    replicated: int
    experts: int


@dataclass(frozen=True)
class Derivation:
    flags: tuple[Flag, ...]
    arithmetic: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()  # why this launch would fail: said before it is tried
    notes: tuple[str, ...] = ()

    def flag(self, name: str) -> Flag | None:
        return next((f for f in self.flags if f.name == name), None)

    def extra_args(self, *, placement: bool = False) -> list[str]:
        """The catalog's and the derived flags for models.json's ``extra_args`` (the
        user's own are theirs to keep; placement's are derived at each launch)."""
        out: list[str] = []
        for f in self.flags:
            if f.origin == "user" or (f.name in ktflags.PLACEMENT_FLAGS and not placement):
                continue
            out += f.argv()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "flags": [f.to_dict() for f in self.flags],
            "arithmetic": list(self.arithmetic),
            "refusals": list(self.refusals),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- GPU experts


def sglang_reserve_mib(
    total_mib: int, tp: int, chunked_prefill: int | None, graph_max_bs: int | None
) -> float:
    """What SGLang keeps out of ``--mem-fraction-static`` when it picks the fraction
    itself (sglang-kt 0.7.2, ``ServerArgs._handle_gpu_memory_settings``): 512 MiB of
    metadata, 1.5 MiB per token of the prefill chunk (at least 2048), 2 MiB per CUDA-graph
    batch size, ``tp/8`` GiB, and at least 10 GiB on a GPU of more than 60 GiB. Its
    defaults for the chunk and the largest graph batch follow the GPU's size."""
    if total_mib < 20 * 1024:
        chunk, bs = 2048, 8
    elif total_mib < 35 * 1024:
        chunk, bs = 2048, 24 if tp < 4 else 80
    elif total_mib < 60 * 1024:
        chunk, bs = 4096, 32 if tp < 4 else 160
    elif total_mib < 160 * 1024:
        chunk, bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, bs = 16384, 512
    chunk = chunked_prefill if chunked_prefill is not None else chunk
    bs = graph_max_bs if graph_max_bs is not None else bs
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + tp / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return float(reserved)


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def _one(flags: Mapping[str, tuple[str, ...]], name: str) -> str | None:
    values = flags.get(name)
    return values[-1] if values else None


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _cfg_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    inner = cfg.get("text_config")
    c = inner if isinstance(inner, Mapping) and "num_hidden_layers" in inner else cfg
    for k in keys:
        v = c.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def gpu_experts(
    topo: Topology,
    gpus: Sequence[int],
    variant: Variant,
    args: Mapping[str, tuple[str, ...]],
    *,
    model_config: Mapping[str, Any] | None,
    sizes: Sizes | None,
    ctx: int,
    tp: int,
) -> tuple[int | None, list[str]]:
    """``--kt-num-gpu-experts`` for these GPUs, and the arithmetic, line by line.
    None when nothing says how big an expert is.

    Three steps, each with its own sources: what SGLang leaves of the GPUs
    (``_sglang_budget``), then either kt's registry formula (before config.json is
    here: ``_registry_estimate``) or the model's own shapes (``_config_estimate``)."""
    planned = [g for g in topo.gpus if g.index in set(gpus)]
    if not planned:
        return None, ["no GPU planned: no experts on the GPU"]
    budget, lines = _sglang_budget(planned, args, tp)
    cfg = model_config or {}
    routed = _cfg_int(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    per_expert: float | None
    if model_config is None:
        if variant.gpu_expert_gb is None:
            return None, [
                *lines,
                "no config.json yet and no expert size in the catalog: not derived",
            ]
        budget, per_expert, lines = _registry_estimate(planned, variant)
    else:
        budget, per_expert = _config_estimate(
            budget, lines, cfg, variant, args, sizes=sizes, ctx=ctx, tp=tp, routed=routed
        )
    if not per_expert:
        return None, [*lines, "expert size unknown: not derived"]
    n = max(0, math.floor(budget / per_expert))
    if routed:
        n = min(n, routed)
    lines.append(
        f"= {_gb(max(budget, 0))} / {_gb(per_expert)} per expert = {n} experts per layer on the GPU"
    )
    return n, lines


def _sglang_budget(
    planned: Sequence[Gpu], args: Mapping[str, tuple[str, ...]], tp: int
) -> tuple[float, list[str]]:
    """The bytes SGLang leaves the GPUs for weights and KV cache: each GPU's free memory
    less what it keeps (``--mem-fraction-static``'s rest, else its own reserve)."""
    lines: list[str] = []
    frac = _num(_one(args, "--mem-fraction-static"))
    chunk = _num(_one(args, "--chunked-prefill-size"))
    bs = _num(_one(args, "--cuda-graph-max-bs"))
    budget = 0.0
    for g in planned:
        free = max(0, g.memory_total_mib - g.memory_used_mib) * MIB
        if frac is not None:
            keep = g.memory_total_mib * MIB * (1 - frac)
            rule = f"(1 - --mem-fraction-static {frac:g}) x {_gb(g.memory_total_mib * MIB)}"
        else:
            keep = (
                sglang_reserve_mib(
                    g.memory_total_mib, tp, int(chunk) if chunk else None, int(bs) if bs else None
                )
                * MIB
            )
            rule = "SGLang's own reserve for activations and CUDA graphs"
        lines.append(f"GPU {g.index}: {_gb(free)} free - {_gb(keep)} kept by SGLang ({rule})")
        budget += max(0.0, free - keep)
    lines.append(f"= {_gb(budget)} for weights and KV cache")
    return budget, lines


def _registry_estimate(planned: Sequence[Gpu], variant: Variant) -> tuple[float, float, list[str]]:
    """Before the files are here: kt's registry formula (a flat reserve per GPU, the
    catalog's size of one expert), its lines replacing SGLang's budget's."""
    assert variant.gpu_expert_gb is not None
    reserve = KT_REGISTRY_RESERVE_GB * GB * len(planned)
    budget = sum(max(0, g.memory_total_mib - g.memory_used_mib) * MIB for g in planned) - reserve
    lines = [
        "before the files are here, kt's registry formula: "
        f"{_gb(budget + reserve)} free - {KT_REGISTRY_RESERVE_GB} GB per GPU "
        f"(attention, KV cache, CUDA graphs) = {_gb(max(budget, 0))}",
        f"one expert per layer: {variant.gpu_expert_gb:g} GB (kt's registry formula)",
    ]
    return budget, variant.gpu_expert_gb * GB, lines


def _config_estimate(
    budget: float,
    lines: list[str],
    cfg: Mapping[str, Any],
    variant: Variant,
    args: Mapping[str, tuple[str, ...]],
    *,
    sizes: Sizes | None,
    ctx: int,
    tp: int,
    routed: int | None,
) -> tuple[float, float | None]:
    """With config.json: the budget less the non-expert weights, the KV cache and kt's
    layerwise prefill, and one expert's size (the headers', else the catalog's); the
    steps appended to ``lines``."""
    dense = sizes.dense + sizes.replicated * (max(tp, 1) - 1) if sizes else None
    how = "safetensors headers" if sizes else "config.json shapes"
    if dense is None:
        dense = fit.dense_bytes_from_config(cfg)
    if dense is not None:
        budget -= dense
        lines.append(f"- {_gb(dense)} attention and other non-expert weights ({how})")
    # SGLang's KV pool holds --max-total-tokens when set, else the context.
    tokens = int(_num(_one(args, "--max-total-tokens")) or 0) or ctx
    tokens = tokens or _cfg_int(cfg, "max_position_embeddings") or 0
    kv = fit.kv_cache_bytes(cfg, tokens) if tokens else None
    if kv is not None:
        budget -= kv
        lines.append(f"- {_gb(kv)} KV cache for {tokens:,} tokens (config.json's shapes)")
    layers = _cfg_int(cfg, "num_hidden_layers") or 0
    moe_layers = max(0, layers - (_cfg_int(cfg, "first_k_dense_replace") or 0))
    per_expert: float | None = None
    if sizes is not None and sizes.experts and routed:
        per_expert = sizes.experts / routed
        lines.append(
            f"one expert per layer: {_gb(sizes.experts)} of experts / {routed} = {_gb(per_expert)}"
        )
    elif variant.gpu_expert_gb is not None:
        per_expert = variant.gpu_expert_gb * GB
        lines.append(f"one expert per layer: {variant.gpu_expert_gb:g} GB (kt's registry formula)")
    if per_expert and _one(args, "--kt-gpu-prefill-token-threshold") and routed and moe_layers:
        layer = per_expert * routed / moe_layers
        budget -= layer
        lines.append(f"- {_gb(layer)} one MoE layer for kt's layerwise prefill")
    return budget, per_expert


# ---------------------------------------------------------------- all of them


class _Flags:
    """The flags being worked out, by name: ``put`` lets the user's own win (and says
    what it overrode); placement's come as ``ktflags`` made them."""

    def __init__(self, user: Mapping[str, tuple[str, ...]]) -> None:
        self.user = user
        self.out: dict[str, Flag] = {}

    def put(self, name: str, values: tuple[str, ...], origin: Origin, why: str) -> None:
        if name in self.user:
            was = " ".join(values) or "on"
            self.out[name] = Flag(
                name, self.user[name], "user", f"yours (the {origin} value: {was})"
            )
        else:
            self.out[name] = Flag(name, values, origin, why)

    def ordered(self) -> tuple[Flag, ...]:
        """The derived ones first, then by name."""
        return tuple(sorted(self.out.values(), key=lambda f: (f.origin != "derived", f.name)))


def derive(
    entry: Entry,
    variant: Variant,
    topo: Topology,
    *,
    extra_args: Sequence[str] = (),
    nodes: Sequence[int] | None = None,
    gpus: Sequence[int] | None = None,
    model_config: Mapping[str, Any] | None = None,
    sizes: Sizes | None = None,
    weights_numa: int | None = None,
    ctx: int = 0,
    cpu_reserve: int = 0,
    reserved_cpus: Sequence[int] = (),
) -> Derivation:
    """The flags for launching ``variant`` of ``entry`` on ``topo``'s ``nodes`` and
    ``gpus`` (default: all of them), the user's ``extra_args`` winning: the catalog's
    first, then for a kt variant placement's, the AMX weights' check and the GPU
    experts (``_kt_flags``)."""
    flags = _Flags(user_flags(extra_args))
    notes: list[str] = []
    catalog = _catalog_flags(flags, entry, variant)
    if not variant.kt_method:
        return Derivation(flags.ordered(), (), (), tuple(notes))
    node_ids = tuple(nodes) if nodes is not None else topo.node_ids
    _cpus, cpuinfer = ktflags.cpus_for(topo, node_ids, reserved_cpus, cpu_reserve, notes)
    cores = len(topo.physical_cores(topo.node_cpus(node_ids)))
    for f in ktflags.flags_for(flags.user, node_ids, cpuinfer, cores, notes):
        why = "placement, at each launch (ktd/core/ktflags.py)"
        flags.out[f.name] = Flag(
            f.name, f.values, f.origin, why if f.origin == "derived" else "yours"
        )
    refusals = _amx_refusals(flags, variant, weights_numa, notes)
    args = {**catalog, **flags.user}
    n, lines = gpu_experts(
        topo,
        tuple(gpus) if gpus is not None else tuple(g.index for g in topo.gpus),
        variant,
        args,
        model_config=model_config,
        sizes=sizes,
        ctx=ctx or (entry.defaults.ctx or 0),
        tp=int(_num(_one(args, "--tp-size")) or 1),
    )
    if n is not None:
        flags.put(EXPERTS_FLAG, (str(n),), "derived", "free GPU memory (see the arithmetic)")
        low = entry.defaults.min_gpu_experts
        if EXPERTS_FLAG not in flags.user and n < low:
            refusals.append(f"{EXPERTS_FLAG} {n}: {entry.name} needs at least {low}")
    else:
        notes.append(f"{EXPERTS_FLAG} not derived: {lines[-1]}")
    return Derivation(flags.ordered(), tuple(lines), tuple(refusals), tuple(notes))


def _catalog_flags(flags: _Flags, entry: Entry, variant: Variant) -> dict[str, tuple[str, ...]]:
    """The entry's and the variant's own flags, its parsers and ``--kt-method``; the
    catalog's args as parsed (what the arithmetic reads, under the user's)."""
    catalog = user_flags([*entry.defaults.args, *variant.args])
    for name, values in catalog.items():
        flags.put(name, values, "catalog", f"{entry.name}'s catalog entry")
    for name, parser in (
        ("--tool-call-parser", entry.defaults.tool_call_parser),
        ("--reasoning-parser", entry.defaults.reasoning_parser),
    ):
        if parser:
            flags.put(name, (parser,), "catalog", f"{entry.name}'s parser")
    if variant.kt_method:
        cpu = ", ".join(variant.cpu) or "no particular CPU feature"
        flags.put(
            METHOD_FLAG,
            (variant.kt_method,),
            "derived",
            f"variant {variant.name}: weights {variant.weights}, needs {cpu}",
        )
    return catalog


def _amx_refusals(
    flags: _Flags, variant: Variant, weights_numa: int | None, notes: list[str]
) -> list[str]:
    """AMX weights are split per NUMA pool at conversion: a placement of another pool
    count is refused before the launch (kt-kernel crashes: ktransformers #2128)."""
    pools = ktflags.int_values(flags.out[ktflags.POOL_FLAG].values)
    method = flags.out[METHOD_FLAG].values[-1] if METHOD_FLAG in flags.out else variant.kt_method
    if method not in AMX_METHODS:
        return []
    if weights_numa is None:
        notes.append(f"{method}: the weights' NUMA count is not read yet (after the pull)")
    elif pools and pools[0] != weights_numa:
        return [
            f"the {method} weights were converted for {weights_numa} NUMA pools but the "
            f"placement gives {pools[0]} ({ktflags.POOL_FLAG} {pools[0]}): kt-kernel "
            f"crashes on such weights (ktransformers #2128); place the model on "
            f"{weights_numa} NUMA nodes or convert the weights again"
        ]
    return []
