"""Where pulled models live, what of them is on disk, and what converted weights say.

The layout (shared with the pull jobs, which write it):

    <catalog.dir>/<owner>--<name>/<commit>/...      the repository's files at that commit
    <catalog.dir>/<owner>--<name>/<commit>/.ktd-complete   written last, when every file
                                                    is whole and its checksum checked

``catalog.dir`` defaults to ``<state_dir>/models``. A commit directory without the marker
is a pull under way or cut short (``complete: false``); only a complete one is loaded.

AMX weights (kt-kernel's ``convert_cpu_weights.py``) are split per NUMA pool at
conversion, and the split is in the tensor names: merged into safetensors, the keys
are ``blk.{layer}.ffn_{up,gate,down}_exps.{expert}.numa.{pool}.weight`` (kt-kernel's
``python/utils/loader.py`` counts the pools by probing ``...numa.{n}.weight``); left
unmerged, each layer is a ``_layer_{i}/`` directory of ``_numa_{n}/`` ones. Either way
the count is read without reading a weight.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "COMPLETE",
    "Pulled",
    "numa_count",
    "on_disk",
    "repo_dir",
    "revision_dir",
]

COMPLETE = ".ktd-complete"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NUMA_KEY = re.compile(r"\.numa\.(\d+)\.(?:weight|scale)$")
_NUMA_DIR = re.compile(r"^_numa_(\d+)$")
_MAX_HEADER = 100 << 20
_MAX_INDEX = 64 << 20


def repo_dir(base: str | Path, repo: str) -> Path:
    """``owner/name`` -> ``<base>/owner--name`` (the hub's own cache spells it so)."""
    return Path(base) / repo.replace("/", "--")


def revision_dir(base: str | Path, repo: str, commit: str) -> Path:
    return repo_dir(base, repo) / commit


@dataclass(frozen=True)
class Pulled:
    """One commit of one repository under ``catalog.dir``."""

    repo: str
    commit: str
    path: str
    complete: bool
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "repo": self.repo,
            "commit": self.commit,
            "path": self.path,
            "complete": self.complete,
            "bytes": self.bytes,
        }


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def on_disk(base: str | Path, repo: str) -> list[Pulled]:
    """Every commit of ``repo`` under ``base``, complete ones first, newest first."""
    root = repo_dir(base, repo)
    try:
        children = [c for c in root.iterdir() if c.is_dir() and _COMMIT.match(c.name)]
    except OSError:
        return []
    out = []
    for c in children:
        marker = c / COMPLETE
        out.append(Pulled(repo, c.name, str(c), marker.is_file(), _size(c)))

    def when(p: Pulled) -> float:
        try:
            return os.stat(Path(p.path) / COMPLETE).st_mtime if p.complete else 0.0
        except OSError:
            return 0.0

    return sorted(out, key=lambda p: (not p.complete, -when(p), p.commit))


def _header_keys(path: Path) -> list[str]:
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return []
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                return []
            doc = json.loads(f.read(n))
    except (OSError, ValueError):
        return []
    return [k for k in doc if k != "__metadata__"] if isinstance(doc, dict) else []


def _keys(weights: Path) -> list[str]:
    index = weights / "model.safetensors.index.json"
    try:
        if index.is_file() and index.stat().st_size <= _MAX_INDEX:
            doc = json.loads(index.read_text())
            wmap = doc.get("weight_map") if isinstance(doc, dict) else None
            if isinstance(wmap, dict):
                return [str(k) for k in wmap]
    except (OSError, ValueError):
        pass
    try:
        shards = sorted(weights.glob("*.safetensors"))
    except OSError:
        return []
    return _header_keys(shards[0]) if shards else []


def numa_count(weights: str | Path) -> int | None:
    """The NUMA pools AMX weights at ``weights`` were converted for, or None when the
    directory holds no such weights (not AMX, not converted, unreadable)."""
    p = Path(weights)
    pools = {int(m.group(1)) for k in _keys(p) if (m := _NUMA_KEY.search(k))}
    if pools:
        return max(pools) + 1
    try:
        layers = sorted(c for c in p.iterdir() if c.is_dir() and c.name.startswith("_layer_"))
    except OSError:
        return None
    for layer in layers[:1]:
        try:
            found = {int(m.group(1)) for c in layer.iterdir() if (m := _NUMA_DIR.match(c.name))}
        except OSError:
            return None
        if found:
            return max(found) + 1
    return None
