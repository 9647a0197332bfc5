"""A catalog name -> what a pull fetches, and whether this box can run it. Pure.

The pull jobs take ``PullSpec`` s and a fit check (``ktd.catalog.pulls``); this is where a
name the user typed (``deepseek-v4-kt``: a name or an alias) becomes them: the entry, the
variant ``choose`` picks for this box, the specs of that variant (``wanted``, under
``catalog.dir``), and the reasons this box cannot run it, each with its numbers: the
chosen variant's refused derivation (a ``--kt-num-gpu-experts`` under the entry's floor),
or, when no variant fits, every variant's reasons (CPU features, RAM, GPU memory, no
GPU). A pull with such reasons is refused before its first byte unless forced; forced, it
fetches the entry's first variant (its preference), which is what a box that can run it
would get too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ktd.catalog.choose import Choice, choose
from ktd.catalog.flags import derive
from ktd.catalog.load import LoadedCatalog
from ktd.catalog.report import UnknownName
from ktd.catalog.schema import Entry, Variant
from ktd.catalog.spec import PullSpec
from ktd.catalog.wanted import pull_specs
from ktd.core.topology import Topology

__all__ = ["Resolved", "UnknownName", "resolve"]


@dataclass(frozen=True)
class Resolved:
    """``problems``: why this box cannot run what the pull would fetch (empty: it can)."""

    name: str
    entry: Entry
    variant: Variant
    choice: Choice
    specs: tuple[PullSpec, ...]
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems


def _cannot(entry: Entry, choice: Choice) -> tuple[str, ...]:
    """One problem: every variant's reasons, the variants apart by `` | ``."""
    each = " | ".join(
        f"{v.variant.name} ({v.variant.kt_method or 'plain SGLang'}): {'; '.join(v.reasons)}"
        for v in choice.verdicts
    )
    return (f"this box cannot run {entry.name}: {each}",)


def resolve(catalog: LoadedCatalog, topo: Topology, base: str | Path, name: str) -> Resolved:
    """``name``'s entry, the variant for ``topo``, its specs under ``base`` and the
    reasons against it. ``UnknownName`` when no entry has that name or alias."""
    entry = catalog.find(name)
    if entry is None:
        raise UnknownName(name)
    c = choose(entry, topo)
    chosen = c.chosen
    if chosen is None:
        variant, problems = entry.variants[0], _cannot(entry, c)
    else:
        variant = chosen.variant
        refused = derive(entry, variant, topo).refusals
        problems = tuple(f"{entry.name} {variant.name}: {r}" for r in refused)
    return Resolved(name, entry, variant, c, pull_specs(entry, variant, base), problems)
