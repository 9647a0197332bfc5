"""The versions of the config, kept in the state dir (``ktctl config history``, issue 39).

One file per version, ``config-history/<seq>.json``: both files' texts as they were, who
made it (the uid the control socket showed, and who the client said it was, kept as
claimed), when, how (``start``, ``reload`` of a hand edit, ``apply``, ``rollback``, ``pull``) and
what changed. Each is written whole or not at all (``statefile.write_bytes``); the
newest ``keep`` stay. A file is read as a version only when it is one (``_check``): it
decodes, its name is its own ``seq``'s (``000042.json`` holds seq 42), and its
``version`` is its texts'. Any other is set aside (``<name>.corrupt-<time>``) and said in
the log, never listed: a file copied or renamed by hand once made the history list a
version that no read could find ("no version 500 ... kept: 1-500"). Blocking: the daemon
calls it from a thread.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import msgspec

from ktd import foreign
from ktd.core.configload import ConfigTexts, models_file_of
from ktd.core.configtext import version_of
from ktd.daemon.pool import statefile
from ktd.protocol import ConfigVersion

log = logging.getLogger("ktd")


class Record(msgspec.Struct, kw_only=True):
    """One version: what it was and the texts."""

    info: ConfigVersion
    config_path: str
    config_text: str
    models_path: str
    models_text: str | None = None
    models_named: bool = False

    def texts(self) -> ConfigTexts:
        models = self.models_text.encode() if self.models_text is not None else None
        return ConfigTexts(
            self.config_path, self.config_text.encode(), self.models_path, models, self.models_named
        )

    def texts_in(self, config_name: str) -> ConfigTexts:
        """Its texts in the files ktd runs from now (``config_name``), for a rollback.

        Each version keeps the path it was read at, but ktd may have been started since
        with ``--config`` at another path (the same state dir): a rollback writes the old
        texts to the file ktd was started with, never where the old version lived (the
        daemon then followed the old path, and later edits of its own file reloaded as
        "no changes"). A ``models_file`` the old config.json names is found from the
        current config's directory, as at a start."""
        config = self.config_text.encode()
        mpath, named = models_file_of(Path(config_name), config)
        models = self.models_text.encode() if self.models_text is not None else None
        return ConfigTexts(config_name, config, str(mpath), models, named)

    @classmethod
    def of(cls, info: ConfigVersion, texts: ConfigTexts) -> Record:
        return cls(
            info=info,
            config_path=texts.config_name,
            config_text=texts.config.decode(errors="replace"),
            models_path=texts.models_name,
            models_text=texts.models.decode(errors="replace") if texts.models is not None else None,
            models_named=texts.models_named,
        )


def texts_version(texts: ConfigTexts) -> str:
    return version_of(texts.config, texts.models_name, texts.models)


_NAME = re.compile(r"^(\d{1,16})\.json$")
_decoder = msgspec.json.Decoder(Record)


def file_name(seq: int) -> str:
    """The one name of version ``seq``'s file."""
    return f"{seq:06d}.json"


class NotAVersion(Exception):
    """A history file that is no version: it does not decode, or it contradicts itself."""


def _check(name: str, data: bytes) -> Record:
    """The version in file ``name``; NotAVersion saying why it is none."""
    try:
        record = foreign.json(data, _decoder)
    except msgspec.DecodeError as exc:  # ValidationError and foreign.Malformed too
        raise NotAVersion(f"does not decode ({exc})") from None
    seq = record.info.seq
    if seq < 1 or name != file_name(seq):
        raise NotAVersion(f"holds seq {seq}, which is not its name's")
    found = texts_version(record.texts())
    if record.info.version != found:
        raise NotAVersion(f"says version {record.info.version!r} of texts that are {found!r}")
    return record


def seq_ranges(seqs: list[int]) -> str:
    """``1-3, 7``: the versions kept, gaps shown (a range hid a gap: "no version 5 ...
    kept: 1-9" when 5 had been set aside); "none" for none."""
    runs: list[list[int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs) or "none"


class History:
    """The versions on disk, their summaries in memory (newest last)."""

    def __init__(self, directory: Path | None, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self._infos: list[ConfigVersion] = []
        self._loaded = False
        # The highest seq a file was named with, a file set aside included: a new version
        # never takes the number of one that was (its ``rollback_of`` may name it).
        self._named = 0

    def _path(self, seq: int) -> Path:
        assert self.directory is not None
        return self.directory / file_name(seq)

    def load(self) -> None:
        """Read what is kept (once, at start). Files that are no version (``_check``) are
        set aside, and said."""
        self._loaded = True
        if self.directory is None or not self.directory.is_dir():
            return
        for stale in self.directory.glob(".*.tmp"):
            stale.unlink(missing_ok=True)  # a daemon killed mid-write (we hold the state lock)
        found = []
        for path in self.directory.iterdir():
            m = _NAME.match(path.name)
            if not m:
                continue
            self._named = max(self._named, int(m[1]))
            try:
                record = _check(path.name, path.read_bytes())
            except OSError as exc:
                log.error("config history: cannot read %s: %s", path, exc)
                continue
            except NotAVersion as exc:
                self._set_aside(path, str(exc))
                continue
            found.append(record.info)
        self._infos = sorted(found, key=lambda i: i.seq)

    @staticmethod
    def _set_aside(path: Path, why: str) -> None:
        try:
            aside = statefile.set_aside(path)
            log.error("config history: %s %s; set aside as %s", path, why, aside.name)
        except OSError as err:
            log.error("config history: %s %s; not read as a version: %s", path, why, err)

    def infos(self) -> list[ConfigVersion]:
        """Newest first."""
        if not self._loaded:
            self.load()
        return list(reversed(self._infos))

    def latest(self) -> ConfigVersion | None:
        infos = self.infos()
        return infos[0] if infos else None

    def next_seq(self) -> int:
        latest = self.latest()
        return max(latest.seq if latest is not None else 0, self._named) + 1

    def kept(self) -> str:
        """The seqs kept, as ``seq_ranges`` says them."""
        return seq_ranges([i.seq for i in self.infos()])

    def get(self, seq: int) -> Record | None:
        """Version ``seq``, checked again as it is read (a file changed since the start);
        None, and forgotten from the list, when it is gone or no version any more: what
        the history lists is what it can give."""
        if self.directory is None or all(i.seq != seq for i in self.infos()):
            return None
        path = self._path(seq)
        try:
            return _check(path.name, path.read_bytes())
        except OSError as exc:
            log.error("config history: cannot read version %d: %s", seq, exc)
        except NotAVersion as exc:
            self._set_aside(path, str(exc))
        self._infos = [i for i in self._infos if i.seq != seq]
        return None

    def add(self, record: Record) -> None:
        """Write ``record`` (OSError: nothing was kept); ``trim`` once it stands."""
        self.infos()
        if self.directory is not None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            statefile.write_bytes(self._path(record.info.seq), msgspec.json.encode(record))
        self._infos.append(record.info)

    def trim(self) -> None:
        """Forget the oldest versions past ``keep``."""
        while len(self._infos) > self.keep:
            old = self._infos.pop(0)
            if self.directory is None:
                continue
            try:
                os.unlink(self._path(old.seq))
            except OSError as exc:
                log.warning("config history: cannot remove version %d: %s", old.seq, exc)

    def drop(self, seq: int) -> None:
        """Take back a version just added (its files could not be written)."""
        self._infos = [i for i in self._infos if i.seq != seq]
        if self.directory is not None:
            try:
                os.unlink(self._path(seq))
            except OSError as exc:
                log.error("config history: cannot remove version %d: %s", seq, exc)
