"""safedir: ktd's directories are created and checked without following symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ktd.daemon.safedir import UnsafeDir, ensure_dir


def test_creates_with_mode_and_returns_a_directory_fd(tmp_path: Path) -> None:
    target = tmp_path / "a" / "run"
    fd = ensure_dir(target, 0o700, what="runtime dir", fix_mode=True)
    try:
        assert os.fstat(fd).st_ino == target.stat().st_ino
    finally:
        os.close(fd)
    assert (target.stat().st_mode & 0o777) == 0o700


def test_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o755)
    real.chmod(0o755)
    link = tmp_path / "run"
    link.symlink_to(real)
    with pytest.raises(UnsafeDir, match="is a symlink; refusing to follow it"):
        ensure_dir(link, 0o700, what="runtime dir", fix_mode=True)
    assert (real.stat().st_mode & 0o777) == 0o755


def test_not_a_directory_and_open_parent_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(UnsafeDir, match="not a directory"):
        ensure_dir(f, 0o700, what="state dir", fix_mode=False)
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)
    with pytest.raises(UnsafeDir, match="writable by everyone without the sticky bit"):
        ensure_dir(open_parent / "run", 0o700, what="runtime dir", fix_mode=True)
    open_parent.chmod(0o1777)  # like /tmp: fine
    os.close(ensure_dir(open_parent / "run", 0o700, what="runtime dir", fix_mode=True))


def test_modes(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o750)
    os.close(ensure_dir(d, 0o700, what="runtime dir", fix_mode=True))
    assert (d.stat().st_mode & 0o777) == 0o700  # fixed through the fd
    d.chmod(0o755)
    os.close(ensure_dir(d, 0o700, what="state dir", fix_mode=False))
    assert (d.stat().st_mode & 0o777) == 0o755  # left as the operator made it
    d.chmod(0o777)
    with pytest.raises(UnsafeDir, match="writable by others"):
        ensure_dir(d, 0o700, what="runtime dir", fix_mode=True)
    assert (d.stat().st_mode & 0o777) == 0o777


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory someone else's")
def test_foreign_owner_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(UnsafeDir, match="owned by uid 65534"):
        ensure_dir(d, 0o700, what="runtime dir", fix_mode=True)
