"""The daemon's record of its engines, so a restarted ktd re-adopts them instead of reloading.

A 600 GB model must survive ``kill -9 ktd``. The record names each engine's
process by (pid, start time, cmdline): all three must match before a new
daemon trusts that the process it finds is the engine it was told about.
Writes are atomic (temp file, rename): a crash mid-write leaves the old record,
never half of one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from ktd import proctree


class EngineRecord(msgspec.Struct, kw_only=True):
    alias: str
    pid: int
    start: int
    engine_id: str
    port: int
    argv: list[str]
    numa_nodes: list[int] = []
    cpus: list[int] = []
    gpus: list[int] = []
    env: dict[str, str] = {}
    since: float = 0.0
    state: str = "ready"
    started_at: float = 0.0
    digest: str = ""  # ModelSpec.launch_digest() of the spec it was started with


class StateFile(msgspec.Struct, kw_only=True):
    version: int = 1
    daemon_pid: int = 0
    engines: list[EngineRecord] = []


def instance_key(state_dir: Path) -> str:
    """Names this daemon's engines in their environment; another daemon's are not ours."""
    return hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:12]


def read(path: Path) -> StateFile:
    try:
        return msgspec.json.decode(path.read_bytes(), type=StateFile)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return StateFile()


def write(path: Path, state: StateFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = msgspec.json.encode(state)
    # No fsync: the record only matters while engines live, and a power loss takes them
    # too; rename alone is atomic against a killed daemon, and costs no disk flush.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def same_process(rec: EngineRecord) -> bool:
    """pid + start time + cmdline: a recycled pid never passes all three."""
    if not proctree.alive((rec.pid, rec.start)):
        return False
    return proctree.cmdline(rec.pid) == rec.argv
