"""Where a pull puts its files: ``<dir>/<org>--<name>/<revision>/``, the repo's files under
it as the hub lays them out, and ktd's own bookkeeping in ``.ktd/`` beside them (the
metadata the hub gave, partial files named by their ETag, the lock, the verified marker).

One directory per repo and revision, so two pulls of one repo at two revisions never share
a partial file, and a load's ``--model-path`` is the directory itself.
"""

from __future__ import annotations

import re
from pathlib import Path

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BadSource(ValueError):
    """A repo or revision that cannot name a hub repository (or would escape the dir)."""


def check_source(repo: str, revision: str) -> None:
    """Refuse a repo or revision that is no hub name: they become path parts, so ``..``
    and slashes in a revision would write outside the catalog's dir."""
    if not _REPO.match(repo) or ".." in repo:
        raise BadSource(f"repo {repo!r} is not ORG/NAME")
    if not _REVISION.match(revision) or ".." in revision:
        raise BadSource(f"revision {revision!r} is not a branch, tag or commit name")


def dest_for(root: Path, repo: str, revision: str) -> Path:
    """The directory a pull of ``repo`` at ``revision`` fills (``<org>--<name>/<rev>``)."""
    check_source(repo, revision)
    org, name = repo.split("/", 1)
    return root / f"{org}--{name}" / revision


def ktd_dir(dest: Path) -> Path:
    return dest / ".ktd"


def meta_path(dest: Path) -> Path:
    """The hub's metadata for the files wanted, as the last plan read it."""
    return ktd_dir(dest) / "meta.json"


def marker_path(dest: Path) -> Path:
    """The verified marker: written after every file's checksum was compared."""
    return ktd_dir(dest) / "verified.json"


def lock_path(dest: Path) -> Path:
    """The worker's lock (flock: the kernel lets go of it when the worker dies)."""
    return ktd_dir(dest) / "lock"


def partial_path(dest: Path, etag: str) -> Path:
    """A file being fetched, named by the hub's ETag: a resume never appends to the bytes
    of another version of the file."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", etag)[:128]
    return ktd_dir(dest) / "partial" / f"{safe}.incomplete"
