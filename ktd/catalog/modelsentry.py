"""A catalog entry, its chosen variant and the pulled paths -> a models.json entry. Pure.

What the pull hands the config desk (which shows its plan and records it as ``pull``):
``path`` is the model's directory, ``kt.kt_weight_path`` the CPU weights (the model's own
directory for the native formats, the converted upload for a ``kt-weights`` variant),
``kt.extra_args`` the catalog's and the derived flags (never placement's, which are
derived at each launch, and never the user's, which they keep where they wrote them).
AMX weights converted for N NUMA pools ask for N nodes (``numa``): ``"all"`` when the
box has exactly N, else the N nodes with the most free memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ktd.catalog.flags import AMX_METHODS, Derivation
from ktd.catalog.schema import Entry, Variant
from ktd.core.config import BACKEND_KT
from ktd.core.topology import Topology

__all__ = ["EntryError", "models_entry"]


class EntryError(ValueError):
    """The entry cannot be written: a path it needs is missing, or the flags were refused."""


def _numa(topo: Topology, count: int) -> str | list[int]:
    if count == len(topo.nodes):
        return "all"
    ranked = sorted(topo.nodes, key=lambda n: (-n.available_kb, n.id))
    return sorted(n.id for n in ranked[:count])


def models_entry(
    entry: Entry,
    variant: Variant,
    paths: Mapping[str, str],
    derivation: Derivation,
    topo: Topology,
    *,
    alias: str | None = None,
    weights_numa: int | None = None,
) -> dict[str, Any]:
    """``paths``: the pulled directories by source role (``model``, ``kt-weights``; a
    ``convert`` variant's converted weights under ``kt-weights`` too)."""
    if derivation.refusals:
        raise EntryError("; ".join(derivation.refusals))
    model = paths.get("model")
    if not model:
        raise EntryError(f"{entry.name}: no model directory (pull {entry.source('model')})")
    out: dict[str, Any] = {
        "path": model,
        "backend": BACKEND_KT,
        "alias": alias or entry.name,
        "catalog": entry.name,  # its derived --kt-num-gpu-experts may be retried fewer
    }
    kt: dict[str, Any] = {}
    if variant.kt_method:
        if variant.weights == "model":
            kt["kt_weight_path"] = model
        else:
            weights = paths.get("kt-weights")
            if not weights:
                raise EntryError(
                    f"{entry.name} {variant.name}: no CPU weights"
                    + (f" (convert them: {variant.convert})" if variant.convert else "")
                )
            kt["kt_weight_path"] = weights
    args = derivation.extra_args()
    if args:
        kt["extra_args"] = args
    if entry.defaults.ctx:
        kt["ctx"] = entry.defaults.ctx
    if kt:
        out["kt"] = kt
    method = derivation.flag("--kt-method")
    if method and method.values and method.values[-1] in AMX_METHODS and weights_numa:
        out["numa"] = _numa(topo, weights_numa)
    return out
