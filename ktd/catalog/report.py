"""What ``ktctl catalog [NAME]`` shows: the catalog against this box and this disk. Pure
but for reading ``catalog.dir`` (sizes of pulled files, the weights' NUMA count); the
daemon runs it in its worker thread with the machine it already reads for placement,
and injects the reader of safetensors headers (``ktd.daemon.engine.weights``), which this
room does not import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ktd.catalog import ondisk
from ktd.catalog.choose import Choice, choose, gpu_memory, host_ram
from ktd.catalog.flags import AMX_METHODS, Sizes, derive
from ktd.catalog.load import LoadedCatalog
from ktd.catalog.schema import Entry
from ktd.core.topology import Topology

__all__ = ["Configured", "UnknownName", "box", "build"]

SizeReader = Callable[[str], Sizes | None]


class UnknownName(LookupError):
    """No entry has that name or alias."""


def box(topo: Topology) -> dict[str, Any]:
    """The box as the catalog judges it."""
    return {
        **topo.cpu_dict(),
        "numa_nodes": len(topo.nodes),
        "physical_cores": len(topo.physical_cores(topo.cpus)),
        "ram_bytes": host_ram(topo),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_total": g.memory_total_mib << 20,
                "memory_free": max(0, g.memory_total_mib - g.memory_used_mib) << 20,
            }
            for g in topo.gpus
        ],
        "gpu_memory": gpu_memory(topo),
        "gpu_error": topo.gpu_error,
    }


def _choice(c: Choice) -> dict[str, Any]:
    chosen = c.chosen
    return {
        "chosen": chosen.variant.name if chosen else None,
        "why": c.why(),
        "variants": [
            {
                "name": v.variant.name,
                "kt_method": v.variant.kt_method,
                "cpu": list(v.variant.cpu),
                "weights": v.variant.weights,
                "fits": v.fits,
                "reasons": list(v.reasons),
                "unknown": list(v.unknown),
            }
            for v in c.verdicts
        ],
    }


def _pulled(entry: Entry, base: str) -> dict[str, list[ondisk.Pulled]]:
    return {s.role + ":" + s.repo: ondisk.on_disk(base, s.repo) for s in entry.sources}


def _complete(pulls: Sequence[ondisk.Pulled], pinned: str | None) -> ondisk.Pulled | None:
    for p in pulls:
        if p.complete and (pinned is None or pinned in (p.commit, p.revision)):
            return p
    return None


@dataclass(frozen=True)
class Configured:
    """A model models.json already has under the entry's name or an alias: its own flags
    win, its directories and weights are what the flags are worked out for."""

    path: str
    kt_weight_path: str | None = None
    extra_args: tuple[str, ...] = ()
    numa: str | list[int] = "auto"
    ctx: int = 0


def _nodes(topo: Topology, numa: str | list[int]) -> tuple[int, ...] | None:
    if isinstance(numa, list):
        return tuple(n for n in numa if n in topo.node_ids)
    return None  # auto, all, none: every node (placement may take fewer)


def _model(
    entry: Entry,
    topo: Topology,
    base: str,
    origin: str,
    sizes: SizeReader | None,
    full: bool,
    mine: Configured | None = None,
) -> dict[str, Any]:
    pulls = _pulled(entry, base)
    paths, numa, converted = _weights(entry, pulls, mine)
    c = choose(entry, topo, converted=converted, numa_counts=numa)
    out: dict[str, Any] = {
        "name": entry.name,
        "aliases": list(entry.aliases),
        "family": entry.family,
        "description": entry.description,
        "file": origin,
        "choice": _choice(c),
        "on_disk": [
            {"role": key.split(":", 1)[0], **p.to_dict()} for key, ps in pulls.items() for p in ps
        ],
        "needs": msgspec.to_builtins(entry.needs),
        "configured": mine is not None,
    }
    if not full:
        return out
    out["entry"] = msgspec.to_builtins(entry)
    out["numa_counts"] = numa
    chosen = c.chosen
    if chosen is not None:
        model = paths.get("model")
        d = derive(
            entry,
            chosen.variant,
            topo,
            model_config=ondisk.model_config(model) if model else None,
            sizes=sizes(model) if (model and sizes) else None,
            weights_numa=numa.get(chosen.variant.name),
            extra_args=mine.extra_args if mine else (),
            nodes=_nodes(topo, mine.numa) if mine else None,
            ctx=mine.ctx if mine else 0,
        )
        out["flags"] = d.to_dict()
    return out


def _weights(
    entry: Entry, pulls: dict[str, list[ondisk.Pulled]], mine: Configured | None
) -> tuple[dict[str, str], dict[str, int], list[str]]:
    """Where the entry's weights are (role -> the complete pull's path, ``model`` the
    configured one's when models.json has it), the NUMA count each variant's weights were
    converted for, and the AMX variants that run on weights converted by hand: what the
    choice is made against."""
    paths: dict[str, str] = {}
    for s in entry.sources:
        got = _complete(pulls[s.role + ":" + s.repo], s.revision)
        if got is not None:
            paths[s.role] = got.path
    numa: dict[str, int] = {}
    for v in entry.variants:
        if v.weights == "kt-weights" and "kt-weights" in paths:
            n = ondisk.numa_count(paths["kt-weights"])
            if n is not None:
                numa[v.name] = n
    converted: list[str] = []
    if mine is not None:
        paths["model"] = mine.path
        n = ondisk.numa_count(mine.kt_weight_path) if mine.kt_weight_path else None
        if n is not None:  # AMX weights converted by hand: what the AMX variants run on
            for v in entry.variants:
                if v.kt_method in AMX_METHODS and v.weights != "model":
                    numa[v.name] = n
                    converted.append(v.name)
    return paths, numa, converted


def build(
    catalog: LoadedCatalog,
    topo: Topology,
    base: str,
    name: str | None = None,
    *,
    sizes: SizeReader | None = None,
    configured: Mapping[str, Configured] | None = None,
) -> dict[str, Any]:
    """The whole report, or (``name``) one entry's with its flags worked out.
    ``configured``: models.json's models by alias; one under an entry's name or alias
    has its flags worked out for its own directories, its own flags winning."""
    mine = configured or {}
    if name is not None:
        entry = catalog.find(name)
        if entry is None:
            raise UnknownName(name)
        entries = [entry]
    else:
        entries = list(catalog.entries)
    return {
        "files": list(catalog.files),
        "problems": [
            {"file": p.file, "field": p.field, "message": p.message} for p in catalog.problems
        ],
        "notes": list(catalog.notes),
        "dir": base,
        "box": box(topo),
        "models": [
            _model(
                e,
                topo,
                base,
                catalog.origin.get(e.name, ""),
                sizes,
                name is not None,
                next((mine[n] for n in (e.name, *e.aliases) if n in mine), None),
            )
            for e in entries
        ],
    }
