"""The pull jobs on the wire (protocol 1.2): a job as ``pulls`` lists it and ``pull.``
events carry it, and a plan as ``pull --dry-run`` answers it. Pure data, msgspec only
(``ktd.protocol`` imports it; ktctl must start fast)."""

from __future__ import annotations

from typing import Annotated

import msgspec

PullName = Annotated[str, msgspec.Meta(max_length=256)]
#: ``ORG/NAME`` or ``ORG/NAME@REVISION`` (the hub's names; the daemon checks them).
RepoRef = Annotated[str, msgspec.Meta(max_length=256)]


class PullFile(msgspec.Struct, kw_only=True):
    name: str
    size: int
    present: int  # bytes of it already here
    lfs: bool = False


class PullPlanView(msgspec.Struct, kw_only=True):
    """What a pull would fetch, before its first byte; ``problems`` are its refusals
    (the disk, and RAM/GPU/CPU where the catalog checks them), with the numbers."""

    repo: str
    revision: str
    commit: str
    dest: str
    files: list[PullFile] = []
    total: int = 0
    present: int = 0
    to_fetch: int = 0
    free: int = 0
    margin: int = 0
    problems: list[str] = []


class PullInfo(msgspec.Struct, kw_only=True):
    """One pull job: ``state`` (an open vocabulary: ``queued``, ``running``, ``done``,
    ``failed``, ``cancelled``), ``phase`` (``plan``, ``fetch``), the bytes, the rate
    (bytes a second) and the ETA (seconds; None until measured); ``kind`` names a failure
    (``refused``, ``gated``, ``missing``, ``disk``, ``checksum``, ``stalled``, ``network``,
    ``server``, ``cancelled``...), ``message`` says it."""

    repo: str
    revision: str
    names: list[str] = []
    role: str = "model"
    dest: str = ""
    state: str = "queued"
    phase: str = "plan"
    file: str = ""
    total: int = 0
    done: int = 0
    rate: float = 0.0
    eta: float | None = None
    restarts: int = 0
    kind: str = ""
    message: str = ""

    @property
    def key(self) -> str:
        return f"{self.repo}@{self.revision}"
