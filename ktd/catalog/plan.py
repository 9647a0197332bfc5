"""A pull's plan, before its first byte: the files and bytes to fetch (from the hub's own
metadata), what is already here, and whether the target filesystem holds the rest with a
margin. Ollama fetches first and finds the full disk later (ollama#6727, #14255); a pull
here that cannot fit is refused with the numbers, unless forced.

``make_plan`` is pure (metadata, what the directory holds, free bytes in; the plan out);
``scan`` and ``free_bytes`` read the disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from ktd.catalog import layout

#: The margin kept free beyond the bytes to fetch: 2% of them, at least 64 MiB (a
#: filesystem filled to its last block fails every other writer on it too).
MARGIN_FRACTION = 0.02
MARGIN_MIN = 64 << 20


class HubFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of the repo as the hub's metadata gives it (``?blobs=true``)."""

    name: str
    size: int
    sha256: str | None = None  # LFS files: the content's sha256, checked after download
    blob_id: str | None = None  # the git object id (checked for files kept in git)

    @property
    def etag(self) -> str:
        """The ETag the hub serves the file under: the sha256 for LFS, the git oid else."""
        return self.sha256 or self.blob_id or self.name


class HubMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The wanted files of one repo at one revision, and the commit the revision named."""

    repo: str
    revision: str
    commit: str
    files: tuple[HubFile, ...]


class PlanFile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size: int
    present: int  # bytes of it already here (the whole file, or a partial one to resume)
    lfs: bool


class PullPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a pull would do; ``problems`` are its refusals (disk, and the injected fit
    check's: RAM, GPUs, CPU), each with its numbers."""

    repo: str
    revision: str
    commit: str
    dest: str
    files: tuple[PlanFile, ...]
    total: int  # bytes of every wanted file
    present: int  # bytes already here
    to_fetch: int  # bytes the pull would fetch
    free: int  # free bytes on the target filesystem
    margin: int  # bytes kept free beyond to_fetch
    problems: tuple[str, ...] = ()

    @property
    def fits_disk(self) -> bool:
        return self.to_fetch + self.margin <= self.free if self.to_fetch else True


#: The catalog side's check of this box against a plan (RAM, GPUs, CPU features on the
#: NUMA nodes the model would get): its problems, each a sentence with the numbers.
FitCheck = Callable[[PullPlan], list[str]]


def no_fit_check(plan: PullPlan) -> list[str]:
    """Until the catalog supplies one: nothing beyond the disk is checked."""
    return []


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def make_plan(meta: HubMeta, dest: Path, have: dict[str, int], free: int) -> PullPlan:
    """The plan for ``meta`` given the bytes ``have`` of each file here and ``free``."""
    files = tuple(
        PlanFile(
            name=f.name, size=f.size, present=min(have.get(f.name, 0), f.size), lfs=bool(f.sha256)
        )
        for f in meta.files
    )
    total = sum(f.size for f in files)
    present = sum(f.present for f in files)
    to_fetch = total - present
    margin = max(int(to_fetch * MARGIN_FRACTION), MARGIN_MIN) if to_fetch else 0
    plan = PullPlan(
        repo=meta.repo,
        revision=meta.revision,
        commit=meta.commit,
        dest=str(dest),
        files=files,
        total=total,
        present=present,
        to_fetch=to_fetch,
        free=free,
        margin=margin,
    )
    if not plan.fits_disk:
        short = to_fetch + margin - free
        problem = (
            f"disk: {gib(to_fetch)} to fetch + {gib(margin)} margin, but {gib(free)} free "
            f"on the filesystem of {dest} ({gib(short)} short)"
        )
        plan = msgspec.structs.replace(plan, problems=(problem,))
    return plan


def scan(meta: HubMeta, dest: Path, bad: frozenset[str] = frozenset()) -> dict[str, int]:
    """The bytes of each wanted file already here: the whole file when one of its size is
    in place (and not flagged ``bad`` by the verified marker), else a partial file's."""
    have: dict[str, int] = {}
    for f in meta.files:
        target = dest / f.name
        try:
            if f.name not in bad and target.stat().st_size == f.size:
                have[f.name] = f.size
                continue
        except OSError:
            pass
        try:
            have[f.name] = layout.partial_path(dest, f.etag).stat().st_size
        except OSError:
            pass
    return have


def free_bytes(dest: Path) -> int:
    """Free bytes (for an unprivileged writer) on the filesystem ``dest`` is or would be on."""
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize
