"""Each engine's API key: made per launch, kept in a file only ktd's uid can read.

Why: SGLang's port answers whoever connects, and every local user can connect to a
port on 127.0.0.1: without a key any of them could generate on ktd's engines past
``api_keys``, admission and every limit (issue 32). With ``--api-key`` SGLang's
middleware answers 401 ``{"error": "Unauthorized"}`` to every route but ``/health*``,
``/metrics*`` (and upstream's ``/ready*``) without ``Authorization: Bearer <key>``.

The key must not be on the command line (``/proc/PID/cmdline`` is world-readable):
it goes in ``<state_dir>/keys/<alias>.yml`` (the directory 0700, the file 0600,
written under a temporary name and renamed), which SGLang reads with ``--config``
and merges as ``--api-key <key>``. The file lives as long as the engine's run: removed
when the run ends, kept when ktd exits leaving engines running (a restarted ktd reads
an adopted engine's key from the file its argv names), and swept at start for files
no adopted engine names. The environment would be private too (``/proc/PID/environ``
is readable by the same uid only), but SGLang reads no key from it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from ktd.core.command import ADMIN_KEY_FLAG, key_file_of, user_key_of
from ktd.daemon import safedir

__all__ = ["KeyDir", "admin_key_of_argv", "auth_headers", "key_of_argv", "new_key", "read_key"]

log = logging.getLogger("ktd")

SUFFIX = ".yml"  # SGLang wants .yaml or .yml; ".yml" is as long as the log's ".log"
_TMP = ".tmp-"


def new_key() -> str:
    """64 hex digits: never starts with ``-`` (argparse would take ``--api-key -x...``
    for a missing value) and needs no quoting anywhere."""
    return secrets.token_hex(32)


def auth_headers(key: str | None) -> dict[str, str]:
    """What every request of ktd's to a keyed engine carries."""
    return {"authorization": f"Bearer {key}"} if key else {}


def read_key(path: str | Path, name: str = "api-key") -> str | None:
    """The ``api-key`` (or ``name``) of a config file ktd wrote; None when it is gone or
    not ours."""
    try:
        with open(path, "rb") as f:
            data = yaml.safe_load(f.read(65536))
    except (OSError, yaml.YAMLError):
        return None
    key = data.get(name) if isinstance(data, dict) else None
    return key if isinstance(key, str) and key else None


def key_of_argv(argv: Sequence[str]) -> tuple[str | None, Path | None]:
    """An engine's key from its argv: the ``--config`` file's (ktd's own), else the user's
    ``--api-key`` as written; and the file, when there is one."""
    path = key_file_of(argv)
    if path is not None:
        return read_key(path) or user_key_of(argv), Path(path)
    return user_key_of(argv), None


def admin_key_of_argv(argv: Sequence[str]) -> str | None:
    """The user's ``--admin-api-key`` an engine runs with: in its ``--config`` file, or
    on its command line."""
    path = key_file_of(argv)
    in_file = read_key(path, "admin-api-key") if path is not None else None
    return in_file or user_key_of(argv, ADMIN_KEY_FLAG)


class KeyDir:
    """``<state_dir>/keys``: one file per running engine, named by its alias."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self) -> None:
        """The directory, ours and 0700 (checked without following a link)."""
        os.close(safedir.ensure_dir(self.path, 0o700, what="engine key dir", fix_mode=True))

    def file_for(self, alias: str) -> Path:
        return self.path / f"{alias}{SUFFIX}"

    def write(self, alias: str, key: str, admin_key: str | None = None) -> Path:
        """The engine's config file with its key (and the user's admin key), 0600 before
        a byte is written."""
        self.prepare()
        dest = self.file_for(alias)
        tmp = self.path / f"{_TMP}{secrets.token_hex(4)}{SUFFIX}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.fchmod(fd, 0o600)
            # A JSON string is a YAML double-quoted scalar: any key, quotes and all.
            text = f"# the engine's API key, written by ktd\napi-key: {json.dumps(key)}\n"
            if admin_key is not None:
                text += f"admin-api-key: {json.dumps(admin_key)}\n"
            os.write(fd, text.encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, dest)
        return dest

    @staticmethod
    def remove(path: Path | None) -> None:
        if path is None:
            return
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove engine key file %s: %s", path, exc.strerror)

    def sweep(self, keep: Iterable[Path]) -> list[Path]:
        """Remove the files no running engine names (left by a ktd that was killed, or by
        engines that died while no ktd watched). Returns what was removed."""
        kept = {p.resolve() for p in keep}
        removed: list[Path] = []
        try:
            entries = list(self.path.iterdir())
        except OSError:
            return removed
        for entry in entries:
            if entry.resolve() in kept:
                continue
            if entry.name.endswith(SUFFIX) or entry.name.startswith(_TMP):
                self.remove(entry)
                removed.append(entry)
        return removed
