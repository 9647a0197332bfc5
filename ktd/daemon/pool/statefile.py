"""The daemon's record of its engines, so a restarted ktd re-adopts them instead of reloading.

A 600 GB model must survive ``kill -9 ktd``. The record is a *hint*, never
proof: a process is adopted only when its environment carries the engine
marker ktd set at spawn (``ownership``), so a forged or stale record cannot
make ktd signal a process it did not start.

The file is written completely or not at all: the bytes go to a temp file in
the same directory (every ``os.write`` checked: a full disk writes short), the
temp file is fsynced, renamed over the old one, and the directory fsynced.
Until the rename the old record stays whole; on any failure the temp file is
removed. A file that does not decode is set aside (``engines.json.corrupt-<ts>``),
never silently read as "no engines".
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ktd import foreign
from ktd.core import states as S
from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree


class ClaimRecord(msgspec.Struct, kw_only=True):
    """A frontend's standing claim: a restarted daemon must not take the engine away
    before that frontend has reported (``ktd.daemon.pool.claimtable``)."""

    id: str
    client: str
    # Its frontend's process (pid, start time; 0: unknown): a restarted daemon voids
    # the claim at once when that process is gone (``claimsync.void_at_restore``).
    pid: int = 0
    start: int = 0


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
    state: S.State = S.READY
    # The step of that state (``Phase.step``): a sleeping engine that was fencing or
    # releasing has memory a restarted ktd cannot know (``ktd.core.lifecycle.adopt``).
    step: str | None = None
    # It has slept in this run: it holds the host copy of its GPU weights (``fit``).
    backed_up: bool = False
    started_at: float = 0.0
    digest: str = ""  # ModelSpec.launch_digest() of the spec it was started with
    claims: list[ClaimRecord] = []


class StateFile(msgspec.Struct, kw_only=True):
    version: int = 1
    daemon_pid: int = 0
    engines: list[EngineRecord] = []


@dataclass(frozen=True)
class Loaded:
    """What reading the record found. ``trusted`` is False when it was corrupt: then
    the record says nothing, and in particular not that no engine is ours."""

    state: StateFile
    trusted: bool
    problem: str | None = None  # a sentence for the daemon log
    set_aside: Path | None = None


def instance_key(state_dir: Path) -> str:
    """Names this daemon's engines in their environment; another daemon's are not ours."""
    return hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:12]


def encode(state: StateFile) -> bytes:
    return msgspec.json.encode(state)


_decoder = msgspec.json.Decoder(StateFile)


def decode(data: bytes) -> StateFile:
    """Raise ``msgspec.DecodeError``/``ValidationError`` on anything malformed."""
    return foreign.json(data, _decoder)


def read(path: Path) -> StateFile:
    """The record, or an empty one (missing or malformed). Does not set anything aside:
    a daemon uses ``load``."""
    try:
        return decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return StateFile()


def load(path: Path, *, now: float | None = None) -> Loaded:
    """Read the record at start-up; a corrupt one is renamed aside so it is kept for
    the operator and not overwritten by the next write."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Loaded(StateFile(), trusted=True)
    except OSError as exc:
        return Loaded(StateFile(), trusted=False, problem=f"cannot read {path}: {exc}")
    try:
        return Loaded(decode(data), trusted=True)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        problem = f"state file {path} is corrupt ({len(data)} bytes: {exc})"
        try:
            aside = set_aside(path, now)
        except OSError as err:
            return Loaded(StateFile(), False, f"{problem}; cannot set it aside: {err}")
        return Loaded(StateFile(), False, f"{problem}; set aside as {aside.name}", aside)


def set_aside(path: Path, now: float | None = None) -> Path:
    """Rename a file that does not decode to ``<name>.corrupt-<time>`` (kept for the
    operator, never overwritten by the next write); raise OSError if it cannot be."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now if now is not None else None))
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
        n += 1
    os.rename(path, aside)
    return aside


def write_all(fd: int, data: bytes) -> None:
    """os.write may write less than asked (a full disk, a signal): loop until all is out.
    A write that makes no progress is an error, never a silent truncation."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[n:]


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(
    path: Path, data: bytes, *, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically and durably, or raise leaving it untouched.
    ``mode`` and ``owner`` (uid, gid) are the new file's (a user's config file keeps its
    own; not root, the owner stays ours, as an editor's save would leave it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            write_all(fd, data)
            if mode != 0o600:
                os.fchmod(fd, mode)
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(fd, *owner)
                except PermissionError:
                    pass
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    # The rename itself is only durable once the directory is flushed.
    fsync_dir(path.parent)


def write(path: Path, state: StateFile) -> None:
    write_bytes(path, encode(state))


def remove_stale_temps(path: Path) -> list[Path]:
    """Temp files a killed daemon left (``.engines.json.<pid>.tmp``); call under the
    state-dir lock, when no other writer can exist."""
    removed = []
    for name in glob.glob(glob.escape(str(path.with_name(f".{path.name}."))) + "*.tmp"):
        try:
            os.unlink(name)
            removed.append(Path(name))
        except OSError:
            pass
    return removed


def ownership(rec: EngineRecord) -> bool:
    """The record names a live engine of ours: the same process (pid + start time) AND
    carrying the marker with the recorded engine id. The marker is the proof; pid and
    start time only tie the record to it."""
    return (
        proctree.alive((rec.pid, rec.start))
        and proctree.owned_by_us(rec.pid)
        and proctree.environ_has(rec.pid, ENGINE_MARK, rec.engine_id)
    )


def same_process(rec: EngineRecord) -> bool:
    """pid + start time + cmdline: identity only, NOT ownership (see ``ownership``)."""
    if not proctree.alive((rec.pid, rec.start)):
        return False
    return proctree.cmdline(rec.pid) == rec.argv
