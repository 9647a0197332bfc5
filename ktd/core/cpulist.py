"""The kernel's CPU list format (``"0-3,8-11"``), read and written in one place.

Apart from the topology values because ktctl shows CPU lists too and must stay
light to import: this module needs nothing but ``re``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["format_cpulist", "parse_cpulist"]


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's list format (``"0-3,8-11"``, ``"5"``, ``""``) into sorted unique ints.

    Also accepts the kernel's stride form ``"0-15:2/4"`` (2 of every 4), which
    ``isolcpus``-style parameters use. Raises ValueError on anything else, so a
    typo in a config never silently pins to the wrong CPUs.
    """
    out: set[int] = set()
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?", part)
        if m is None:
            raise ValueError(f"bad cpulist element {part!r} in {text!r}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise ValueError(f"bad cpulist range {part!r}: end before start")
        if m[3] is not None:
            used, group = int(m[3]), int(m[4])
            if group <= 0 or used <= 0 or used > group:
                raise ValueError(f"bad cpulist stride {part!r}")
            out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
        else:
            out.update(range(lo, hi + 1))
    return sorted(out)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpulist`: sorted, deduplicated, runs collapsed."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
