"""Where pulled models live, what of them is on disk, and what converted weights say.

One layout, the pull jobs' (``ktd.catalog.layout``, which writes it):

    <catalog.dir>/<org>--<name>/<revision>/...      the repository's files at that revision
                                                    (the pinned commit, or the ref: ``main``)
    <catalog.dir>/<org>--<name>/<revision>/.ktd/    ktd's bookkeeping: the hub's metadata,
                                                    partial files, the lock, and
                                                    ``verified.json``, written last, with
                                                    the commit and every file's checksum

``catalog.dir`` defaults to ``<state_dir>/models``. A revision directory is complete when
``ktd.catalog.verify.verified`` says so (the marker, no flagged file, every file the size
it was checked at): the same gate a load's preflight uses. One with a ``.ktd/`` and no
such marker is a pull under way or cut short (``complete: false``, with the bytes fetched
so far, partial files included); a directory without ``.ktd/`` is no pull and not listed.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ktd.catalog import layout, verify

__all__ = [
    "Pulled",
    "model_config",
    "numa_count",
    "on_disk",
    "repo_dir",
    "revision_dir",
]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NUMA_KEY = re.compile(r"\.numa\.(\d+)\.(?:weight|scale)$")
_NUMA_DIR = re.compile(r"^_numa_(\d+)$")
_MAX_HEADER = 100 << 20
_MAX_INDEX = 64 << 20


def repo_dir(base: str | Path, repo: str) -> Path:
    """``org/name`` -> ``<base>/org--name`` (the hub's own cache spells it so)."""
    return Path(base) / repo.replace("/", "--")


def revision_dir(base: str | Path, repo: str, revision: str) -> Path:
    """Where a pull of ``repo`` at ``revision`` lives: ``layout.dest_for``'s directory."""
    return layout.dest_for(Path(base), repo, revision)


@dataclass(frozen=True)
class Pulled:
    """One revision of one repository under ``catalog.dir``. ``commit``: the commit the
    verified marker records (else the directory's name when it is one, else empty)."""

    repo: str
    revision: str
    commit: str
    path: str
    complete: bool
    bytes: int
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "problems": list(self.problems)}


def model_config(path: str) -> dict[str, Any] | None:
    """The model's ``config.json`` under ``path`` (its shapes: the arithmetic of the GPU
    experts), None when there is none or it is no JSON object."""
    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _size(path: Path) -> int:
    """The bytes of the repository's files here, and of the partial files being fetched
    (``.ktd/partial``); not ktd's other bookkeeping."""
    total = 0
    for dirpath, dirs, files in os.walk(path):
        if Path(dirpath) == path and ".ktd" in dirs:
            dirs.remove(".ktd")
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    try:
        for part in (layout.ktd_dir(path) / "partial").iterdir():
            total += part.stat().st_size
    except OSError:
        pass
    return total


def _pulled(repo: str, c: Path) -> Pulled:
    marker = verify.read_marker(c)
    ok, problems = verify.verified(c)
    commit = marker.commit if marker else (c.name if _COMMIT.match(c.name) else "")
    return Pulled(repo, c.name, commit, str(c), ok, _size(c), tuple(problems) if marker else ())


def on_disk(base: str | Path, repo: str) -> list[Pulled]:
    """Every pulled revision of ``repo`` under ``base``, complete ones first, the latest
    verified first."""
    root = repo_dir(base, repo)
    try:
        children = [c for c in root.iterdir() if c.is_dir() and layout.ktd_dir(c).is_dir()]
    except OSError:
        return []
    out = []
    for c in children:
        try:
            layout.check_source(repo, c.name)
        except layout.BadSource:
            continue
        out.append(_pulled(repo, c))

    def when(p: Pulled) -> float:
        try:
            return layout.marker_path(Path(p.path)).stat().st_mtime if p.complete else 0.0
        except OSError:
            return 0.0

    return sorted(out, key=lambda p: (not p.complete, -when(p), p.revision))


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
