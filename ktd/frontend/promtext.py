"""Merge engines' Prometheus expositions into one, each sample labelled with its alias. Pure.

Why: an operator scrapes one address (the frontend) and must still tell which
engine a ``sglang:num_running_reqs`` came from. Every engine exposes the same
families, and the text format allows one ``# HELP``/``# TYPE`` per family, so
samples are grouped by family across engines and each gets ``alias="..."``
(an engine sample that already carries an ``alias`` label keeps its own).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class _Family:
    help: str | None = None
    type: str | None = None
    samples: list[str] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_sample(line: str, alias: str) -> str:
    """``name{a="b"} 1`` -> ``name{alias="x",a="b"} 1``; ``name 1`` -> ``name{alias="x"} 1``."""
    label = f'alias="{_escape(alias)}"'
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        inner = line[brace + 1 : close]
        if 'alias="' in inner:
            return line
        sep = "," if inner.strip() else ""
        return f"{line[: brace + 1]}{label}{sep}{line[brace + 1 :]}"
    if space == -1:
        return line
    return f"{line[:space]}{{{label}}}{line[space:]}"


def merge(expositions: Iterable[tuple[str, str]]) -> str:
    """``[(alias, text), ...]`` -> one exposition (text format 0.0.4)."""
    families: dict[str, _Family] = {}
    for alias, text in expositions:
        current: str | None = None
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    fam = families.setdefault(current, _Family())
                    rest = parts[3] if len(parts) > 3 else ""
                    if parts[1] == "HELP" and fam.help is None:
                        fam.help = rest
                    elif parts[1] == "TYPE" and fam.type is None:
                        fam.type = rest
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            owner = current if current is not None and name.startswith(current) else name
            families.setdefault(owner, _Family()).samples.append(label_sample(line, alias))
    out: list[str] = []
    for name, fam in families.items():
        if not fam.samples:
            continue
        if fam.help is not None:
            out.append(f"# HELP {name} {fam.help}")
        if fam.type is not None:
            out.append(f"# TYPE {name} {fam.type}")
        out.extend(fam.samples)
    return "\n".join(out) + ("\n" if out else "")
