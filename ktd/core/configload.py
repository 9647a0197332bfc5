"""A config from its files: read within their limits, decoded naming the byte or the
field that is wrong, checked, resolved.

The one module that touches the files (``read_config_file``: a regular file, bounded)
and the one path from bytes to a ``Config`` (``parse_config``), so ``ktd serve``,
``ktctl config``, the history and the desk read a config the same way. Blocking only
where it reads files; ``parse_config`` is pure.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ktd import foreign
from ktd.core.config import Config, ConfigError, ConfigFile, ModelEntry, resolve_models
from ktd.core.configcheck import check_entries, check_sections

#: The largest config.json or models.json ktd reads: a file past it is a mistake (or
#: ``/dev/zero``), and reading it whole would grow the daemon without bound.
MAX_CONFIG_BYTES = 4 << 20


def read_config_file(path: Path) -> bytes:
    """A config file's bytes: a regular file only (a FIFO or a device would block or never
    end; it is opened without blocking to find out), at most ``MAX_CONFIG_BYTES``.
    Raises OSError with a sentence for people."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file ({_file_kind(st.st_mode)})")
        if st.st_size > MAX_CONFIG_BYTES:
            raise OSError(f"{st.st_size} bytes: more than the {MAX_CONFIG_BYTES} ktd reads")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"more than the {MAX_CONFIG_BYTES} bytes ktd reads")
    return data


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a plain file"


@dataclass(frozen=True)
class ConfigTexts:
    """The two files of a config as bytes, and where they are: what a version of the
    config is (``ktctl config``, the history), read once and parsed from memory."""

    config_name: str
    config: bytes
    models_name: str
    models: bytes | None  # None: no models file
    models_named: bool = False  # config.json names it (``models_file``): it must exist


def models_file_of(cfg_path: Path, config: bytes) -> tuple[Path, bool]:
    """Where a config's models file is, and whether config.json names it. Read leniently
    (a config.json that does not validate still says where its models are; a text that
    is no JSON object means the default ``models.json`` beside it)."""
    try:
        doc = foreign.json_any(config)
    except msgspec.DecodeError:  # foreign.Malformed too: parse_config says what is wrong
        doc = None
    named = doc.get("models_file") if isinstance(doc, dict) else None
    if isinstance(named, str) and named:
        return cfg_path.parent / named, True
    return cfg_path.parent / "models.json", False


def read_config_texts(path: str | Path, *, missing_ok: bool = False) -> ConfigTexts:
    """Both files' bytes (regular files, bounded); ConfigError when one cannot be read.
    ``missing_ok``: a models file config.json names but that does not exist is read as
    none (what is on disk, for ``ktctl config``); parsing refuses it. Blocking (files)."""
    cfg_path = Path(path)
    cfg_name = str(cfg_path)
    try:
        data = read_config_file(cfg_path)
    except OSError as exc:
        raise ConfigError(cfg_name, "", f"cannot read: {exc.strerror or exc}") from None
    mpath, named = models_file_of(cfg_path, data)
    mdata = None
    if mpath.exists() or (named and not missing_ok):
        try:
            mdata = read_config_file(mpath)
        except OSError as exc:
            raise ConfigError(
                cfg_name, "$.models_file", f"cannot read {mpath}: {exc.strerror or exc}"
            ) from None
    return ConfigTexts(cfg_name, data, str(mpath), mdata, named)


def parse_config(texts: ConfigTexts) -> Config:
    """Validate and resolve a config from its files' bytes (pure); ConfigError names the
    file and the field."""
    cfg_name, models_name = texts.config_name, texts.models_name
    file: ConfigFile = _decode_json(cfg_name, texts.config, ConfigFile)
    check_sections(file, cfg_name)
    entries: list[ModelEntry] = []
    if texts.models is not None:
        entries = _decode_json(models_name, texts.models, list[ModelEntry])
    elif texts.models_named:
        raise ConfigError(cfg_name, "$.models_file", f"{models_name} does not exist")
    check_entries(file, entries, cfg_name, models_name)
    models = resolve_models(file, entries, cfg_name, models_name)
    return Config(path=cfg_name, file=file, models=models, entries=entries)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read, validate and resolve a config; bad input raises ConfigError and nothing else.
    Blocking (files): the daemon calls it from a thread, bounded (``ktd.daemon.main``)."""
    return parse_config(read_config_texts(path))


# ---------------------------------------------------------------- decoding

_MSGSPEC_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>.*)`$", re.S)


def _validation_error(file: str, exc: Exception, base: str = "$") -> ConfigError:
    text = str(exc)
    m = _MSGSPEC_AT.match(text)
    if m:
        return ConfigError(file, base + m["path"][1:], m["msg"])
    return ConfigError(file, base, text)


def _decode_json(file: str, data: bytes, type_: Any) -> Any:
    """A config file's bytes as ``type_``; ConfigError naming the file otherwise (not
    JSON, not UTF-8, nested deeper than ``foreign.MAX_DEPTH``: a hand-written file is
    someone else's text, and ``ktd serve`` names it rather than dying of it)."""
    try:
        return foreign.json(data, msgspec.json.Decoder(type_))
    except msgspec.ValidationError as exc:
        raise _validation_error(file, exc) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(file, "", f"not valid JSON: {_json_position(data, exc)}") from None


def _json_position(data: bytes, exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"\(byte (\d+)\)", text)
    if not m:
        return text
    offset = int(m[1])
    head = data[:offset]
    line = head.count(b"\n") + 1
    col = offset - (head.rfind(b"\n") + 1) + 1
    return f"{text} (line {line}, column {col})"
