"""Checksums of pulled files, and the verified marker a load reads before its first launch.

Every LFS file's sha256 is compared with the hub's metadata after its download, and every
file kept in git with its git object id; the outcome is written to ``.ktd/verified.json``.
``verified(dest)`` is the load path's check: cheap (the marker and the files' sizes, no
hashing), so a preflight can call it on every load.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from ktd.catalog import layout
from ktd.catalog.plan import HubFile

_CHUNK = 1 << 20


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size: int
    sha256: str | None = None


class Marker(msgspec.Struct, frozen=True, kw_only=True):
    """What the last complete pull found: the files it checked, and its problems (a file
    whose checksum did not match stays on disk, named here, and no load takes it)."""

    repo: str
    revision: str
    commit: str
    files: tuple[Checked, ...]
    problems: tuple[str, ...] = ()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_oid_of(path: Path) -> str:
    """The git blob id of a file (sha1 of ``blob <size>\\0`` and the bytes), as the hub's
    ``blobId`` gives it for files kept in git."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_file(path: Path, want: HubFile, sha256: str | None = None) -> str | None:
    """None when ``path`` is the hub's file ``want``; else the problem, with both sums.
    ``sha256``: the file's sum taken as it was written (else it is read here)."""
    size = path.stat().st_size
    if size != want.size:
        return f"{want.name}: {size} bytes, the hub says {want.size}"
    if want.sha256:
        got = sha256 or sha256_of(path)
        if got != want.sha256.lower():
            return f"{want.name}: sha256 {got}, the hub says {want.sha256}"
    elif want.blob_id:
        got = git_oid_of(path)
        if got != want.blob_id.lower():
            return f"{want.name}: git object {got}, the hub says {want.blob_id}"
    return None


def write_marker(dest: Path, marker: Marker) -> None:
    path = layout.marker_path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(marker))
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_marker(dest: Path) -> Marker | None:
    try:
        return msgspec.json.decode(layout.marker_path(dest).read_bytes(), type=Marker)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def bad_files(dest: Path) -> frozenset[str]:
    """The files the marker flags (their checksum did not match): fetched again."""
    marker = read_marker(dest)
    if marker is None:
        return frozenset()
    return frozenset(p.split(":", 1)[0] for p in marker.problems)


def verified(dest: str | Path) -> tuple[bool, list[str]]:
    """Whether ``dest`` holds a complete, checked pull: (ok, problems). The load path's
    gate: a directory without the marker, with a flagged file, or with a file whose size
    changed since it was checked is refused, with what is wrong."""
    dest = Path(dest)
    marker = read_marker(dest)
    if marker is None:
        return False, [f"{dest}: no verified pull here (pull it, or its download is unfinished)"]
    problems = list(marker.problems)
    for f in marker.files:
        try:
            size = (dest / f.name).stat().st_size
        except OSError:
            problems.append(f"{f.name}: missing")
            continue
        if size != f.size:
            problems.append(f"{f.name}: {size} bytes, {f.size} when it was checked")
    return not problems, problems


def pull_problems(path: str | Path) -> list[str]:
    """A load's check of a model path: nothing for a path ktd did not pull (no ``.ktd``
    beside its files); for a pull's directory, what ``verified`` finds wrong with it."""
    path = Path(path)
    if not layout.ktd_dir(path).is_dir():
        return []
    ok, problems = verified(path)
    return [] if ok else [f"the pull in {path} is not verified: {'; '.join(problems)}"]
