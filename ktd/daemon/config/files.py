"""The config's files, read and written by the daemon (``ktctl config``, issue 39).

Reading is off the event loop and bounded (a hung network filesystem refuses the
request and keeps the running config instead of freezing the daemon). Writing is
``statefile``'s: the bytes go to a temp file beside the target (every write checked: a
full disk writes short), the temp file is fsynced, renamed over the old one, and the
directory fsynced; until the rename the old file stays whole, and on any failure the
temp file is removed. The files are the user's: a new file keeps the mode and owner
the old one had, and a symlinked config is written through to its target (the link
stays). Two files are two renames: when the second fails, the first is put back.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from ktd.core.config import ConfigError
from ktd.core.configload import ConfigTexts, read_config_file, read_config_texts
from ktd.daemon.pool.statefile import write_bytes

#: Seconds a read of the config files may take (a hung network filesystem): then the
#: request is refused and the running config kept; the daemon never waits on the files.
CONFIG_READ_TIMEOUT = 10.0


async def read_texts(path: str, *, missing_ok: bool = False) -> ConfigTexts:
    """Both files' bytes, off the daemon's loop and bounded. ``missing_ok``: a models
    file config.json names but that is not there yet reads as none (``ktctl config``:
    a change may bring it)."""
    with trio.move_on_after(CONFIG_READ_TIMEOUT):
        return await trio.to_thread.run_sync(
            lambda: read_config_texts(path, missing_ok=missing_ok), abandon_on_cancel=True
        )
    raise ConfigError(path, "", f"not read within {CONFIG_READ_TIMEOUT:g}s (a hung filesystem?)")


async def read_models(path: str, config_name: str) -> bytes | None:
    """One models file's bytes (None: not there), off the loop and bounded."""

    def read() -> bytes | None:
        if not Path(path).exists():
            return None
        try:
            return read_config_file(Path(path))
        except OSError as exc:
            raise ConfigError(
                config_name, "$.models_file", f"cannot read {path}: {exc.strerror or exc}"
            ) from None

    with trio.move_on_after(CONFIG_READ_TIMEOUT):
        return await trio.to_thread.run_sync(read, abandon_on_cancel=True)
    raise ConfigError(path, "", f"not read within {CONFIG_READ_TIMEOUT:g}s (a hung filesystem?)")


@dataclass(frozen=True)
class FileChange:
    """One file to write: its new bytes, and what it held before (None: it did not exist)."""

    path: str
    new: bytes
    old: bytes | None


def _target(path: str) -> Path:
    """Where the bytes go: a symlink's target, so the user's link stays a link."""
    return Path(os.path.realpath(path))


def write_file(path: str, data: bytes, like: str | None = None) -> None:
    """Replace ``path`` with ``data`` atomically and durably, or raise leaving it as it was.
    Its mode and owner are kept (a new file takes ``like``'s, else 0644)."""
    target = _target(path)
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = os.stat(like) if like is not None else None
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    owner = (st.st_uid, st.st_gid) if st is not None else None
    write_bytes(target, data, mode=mode, owner=owner)


def _restore(change: FileChange) -> None:
    if change.old is None:
        os.unlink(_target(change.path))
    else:
        write_file(change.path, change.old)


Writer = Callable[[Sequence[FileChange]], None]


def write_files(changes: Sequence[FileChange]) -> None:
    """Write each file in turn (blocking); when one fails, the ones already written get
    their old bytes back, and the first error is raised."""
    done: list[FileChange] = []
    like = next((c.path for c in changes if c.old is not None), None)
    for change in changes:
        try:
            write_file(change.path, change.new, like)
        except OSError:
            for back in reversed(done):
                try:
                    _restore(back)
                except OSError:
                    pass  # said in the error below: the first file may hold the new text
            raise
        done.append(change)


def changed_files(before: ConfigTexts | None, after: ConfigTexts) -> list[str]:
    if before is None:
        return [after.config_name] + ([after.models_name] if after.models is not None else [])
    out = []
    if before.config != after.config:
        out.append(after.config_name)
    moved = (before.models_name, before.models) != (after.models_name, after.models)
    if moved and after.models is not None:
        out.append(after.models_name)
    return out


def file_changes(disk: ConfigTexts, new: ConfigTexts) -> list[FileChange]:
    """What to write, models first: a config.json naming a new models file never points
    at one not yet there."""
    out = []
    if new.models is not None:
        old = disk.models if new.models_name == disk.models_name else _read_or_none(new.models_name)
        if old != new.models:
            out.append(FileChange(new.models_name, new.models, old))
    if new.config != disk.config:
        out.append(FileChange(new.config_name, new.config, disk.config))
    return out


def _read_or_none(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None
