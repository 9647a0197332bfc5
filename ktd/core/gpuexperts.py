"""The out-of-memory retry of a derived ``--kt-num-gpu-experts`` (issue 44 item 6). Pure.

Why: the catalog works the GPU-experts count out from the free GPU memory less what
attention, the KV cache and CUDA graphs take (``ktd.catalog.flags``); that arithmetic is
an estimate, and too many experts run the card out of memory at the weight load or at
the KV cache's sizing (ktransformers #1651, #2183). The first load that does so retries
once, at once, with fewer; the count that then loads is kept for that model on that host
and used by its next loads (and by the next daemon's), until the derived count itself
changes (the entry was written again for another card).

Only a *derived* count is touched: one in an entry the catalog wrote (``catalog`` set)
whose ``kt.extra_args`` has the flag. A user's own count is theirs: a failure is theirs.

What counts as out of GPU memory is what SGLang prints (checked in its source):
torch's ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`` in the
scheduler's "Scheduler hit an exception" traceback, kt-kernel's ``CUDA out of memory``,
and SGLang's own ``Not enough memory. Please try to increase --mem-fraction-static``
when the experts left no room for the KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "FLAG",
    "Ended",
    "ExpertsMachine",
    "Kept",
    "Retry",
    "derived_count",
    "fewer",
    "out_of_memory",
    "with_count",
]

FLAG = "--kt-num-gpu-experts"

#: Lines of an engine's log that say the GPU ran out of memory (lower case).
OOM_MARKERS = (
    "cuda out of memory",
    "cuda error: out of memory",
    "outofmemoryerror",
    "not enough memory. please try to increase --mem-fraction-static",
)

#: The retry's cut: a quarter of the count (at least one expert) off.
CUT = 0.25


def out_of_memory(lines: Sequence[str]) -> bool:
    """Does an engine's log tail say it ran out of GPU memory?"""
    return any(marker in line.lower() for line in lines for marker in OOM_MARKERS)


def derived_count(catalog: str, extra_args: Sequence[str]) -> int | None:
    """The entry's derived ``--kt-num-gpu-experts`` (its last), or None: not a catalog
    entry's, no such flag, or not a whole number >= 0."""
    if not catalog:
        return None
    value: str | None = None
    for i, arg in enumerate(extra_args):
        if arg == FLAG and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith(FLAG + "="):
            value = arg.split("=", 1)[1]
    if value is None or not value.isdigit():
        return None
    return int(value)


def with_count(extra_args: Sequence[str], count: int) -> tuple[str, ...]:
    """``extra_args`` with every ``--kt-num-gpu-experts`` value set to ``count``."""
    out = list(extra_args)
    for i, arg in enumerate(out):
        if arg == FLAG and i + 1 < len(out):
            out[i + 1] = str(count)
        elif arg.startswith(FLAG + "="):
            out[i] = f"{FLAG}={count}"
    return tuple(out)


def fewer(count: int) -> int:
    """The count a retry launches with: a quarter fewer, at least one fewer, never < 0."""
    return max(0, count - max(1, math.ceil(count * CUT)))


@dataclass(frozen=True)
class Retry:
    """Launch again at once with ``count`` experts on the GPU (``used`` ran out)."""

    used: int
    count: int

    def reason(self) -> str:
        return (
            f"out of GPU memory with {FLAG} {self.used} (derived); retrying once with {self.count}"
        )


@dataclass(frozen=True)
class Ended:
    """No retry: the failure stands as it is."""


@dataclass(frozen=True)
class Kept:
    """``count`` loaded where ``derived`` did not: keep it for the model on this host."""

    derived: int
    count: int


@dataclass
class _Model:
    derived: int | None = None  # the kept count's derived count (another one: forgotten)
    kept: int | None = None
    trying: int | None = None  # a retry's count, until its load ends
    trying_for: int | None = None  # the derived count the retry cut (another one: not used)


@dataclass
class ExpertsMachine:
    """Per model (on this host): the count to launch with, the retry, what is kept.

    Events: ``launch`` (a launch is about to be built), ``failed`` (a load ended before
    ready), ``ready``, ``ended`` (a load ended another way: stopped, busy). ``kept``
    holds what earlier daemons kept (restored from the state file)."""

    models: dict[str, _Model] = field(default_factory=dict)

    def restore(self, alias: str, derived: int, kept: int) -> None:
        if 0 <= kept < derived:
            self.models[alias] = _Model(derived=derived, kept=kept)

    def kept(self, alias: str, derived: int | None) -> int | None:
        """The count kept for ``alias`` when its derived count is still ``derived``."""
        m = self.models.get(alias)
        if m is None or derived is None or m.derived != derived:
            return None
        return m.kept

    def launch(self, alias: str, derived: int | None) -> int | None:
        """The count this launch uses: a retry's, else the kept one, else the derived one
        (None: the model has no derived count; its argv is left as written)."""
        if derived is None:
            return None
        m = self.models.get(alias)
        if m is not None and m.trying is not None and m.trying_for == derived:
            return m.trying
        kept = self.kept(alias, derived)
        return derived if kept is None else kept

    def failed(self, alias: str, derived: int | None, oom: bool) -> Retry | Ended:
        """A load ended before ready. Out of GPU memory with a derived count, and not
        already a retry: retry once with fewer. Otherwise the failure stands."""
        m = self.models.setdefault(alias, _Model())
        used = self.launch(alias, derived)
        if m.trying is not None or not oom or used is None or used == 0:
            m.trying = None
            return Ended()
        m.trying, m.trying_for = fewer(used), derived
        return Retry(used, m.trying)

    def ready(self, alias: str, derived: int | None) -> Kept | None:
        """The load reached ready: a retry's count is kept (the derived one is not:
        nothing to keep when it loads as written)."""
        m = self.models.get(alias)
        if m is None or m.trying is None:
            return None
        count, m.trying = m.trying, None
        if derived is None or derived != m.trying_for:  # the entry was written again meanwhile
            return None
        m.derived, m.kept = derived, count
        return Kept(derived, count)

    def ended(self, alias: str) -> None:
        """The load ended another way (stopped, busy): a retry under way is dropped."""
        m = self.models.get(alias)
        if m is not None:
            m.trying = None

    def trying(self, alias: str) -> int | None:
        m = self.models.get(alias)
        return None if m is None else m.trying
