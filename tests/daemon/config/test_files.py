"""Writing the user's config files: whole or not at all, their mode, owner and links kept,
and two files back as they were when the second cannot be written (issue 39)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from ktd.daemon.config.files import FileChange, write_file, write_files
from ktd.daemon.pool import statefile


def test_a_file_is_replaced_keeping_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text("[]\n")
    os.chmod(path, 0o640)
    write_file(str(path), b'[{"alias": "a"}]\n')
    assert path.read_bytes() == b'[{"alias": "a"}]\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["models.json"]  # no temp file left


def test_a_symlinked_config_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "models.json").write_text("[]\n")
    link = tmp_path / "models.json"
    link.symlink_to(real / "models.json")
    write_file(str(link), b"[1]\n")
    assert link.is_symlink() and (real / "models.json").read_bytes() == b"[1]\n"


def test_a_new_file_takes_the_mode_of_its_sibling(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    os.chmod(cfg, 0o600)
    write_file(str(tmp_path / "models.json"), b"[]\n", like=str(cfg))
    assert stat.S_IMODE((tmp_path / "models.json").stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "models.json"
    path.write_text("[]\n")

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(statefile, "write_all", full)
    with pytest.raises(OSError, match="No space left"):
        write_file(str(path), b"[1]\n")
    assert path.read_text() == "[]\n"
    assert [p.name for p in tmp_path.iterdir()] == ["models.json"]


def test_when_the_second_file_fails_the_first_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models, cfg = tmp_path / "models.json", tmp_path / "config.json"
    models.write_text("[]\n")
    cfg.write_text("{}\n")
    real = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "config.json":
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    changes = [
        FileChange(str(models), b"[1]\n", b"[]\n"),
        FileChange(str(cfg), b'{"a": 1}\n', b"{}\n"),
    ]
    with pytest.raises(OSError, match="Input/output"):
        write_files(changes)
    monkeypatch.setattr(os, "replace", real)
    assert (models.read_text(), cfg.read_text()) == ("[]\n", "{}\n")
    # A file the change created is removed again.
    new = tmp_path / "other.json"
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        write_files([FileChange(str(new), b"[]\n", None), changes[1]])
    assert not new.exists()
