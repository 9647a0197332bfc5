"""EngineLog: the file the engine writes, followed for the tail; rotation; failures."""

from __future__ import annotations

import os
from pathlib import Path

from ktd.enginelog import EngineLog


def test_follow_lines_partial_and_carriage_returns(tmp_path: Path) -> None:
    published: list[str] = []
    log = EngineLog(tmp_path / "a.log", publish=published.extend)
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    os.write(fd, b"one\ntw")
    assert log.poll() == ["one"]
    os.write(fd, b"o\nprogress 10%\rprogress 100%\n")
    assert log.poll() == ["two", "progress 100%"]
    log.note("hello")
    assert log.last(1) == ["[ktd] hello"]
    assert published == ["one", "two", "progress 100%", "[ktd] hello"]
    os.close(fd)


def test_from_end_skips_an_earlier_engine(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("old run\n")
    log = EngineLog(tmp_path / "a.log")
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    os.write(fd, b"new run\n")
    assert log.poll() == ["new run"]
    os.close(fd)


def test_rotation_copytruncate_keeps_engine_fd_working(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    log = EngineLog(path, max_bytes=100, backups=2)
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    for i in range(3):
        os.write(fd, b"x" * 120 + b"\n")
        log.poll()
        assert path.stat().st_size == 0, i
    os.write(fd, b"after\n")
    assert log.poll() == ["after"]
    assert (tmp_path / "a.log.1").exists() and (tmp_path / "a.log.2").exists()
    assert not (tmp_path / "a.log.3").exists()
    assert len(log.tail) == 4
    os.close(fd)


def test_unwritable_directory_keeps_the_tail(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EngineLog(blocker / "logs" / "a.log")
    assert log.open_for_engine() is None
    assert log.error and "a.log" in log.error
    log.feed(b"line from a pipe\n")
    log.note("still here")
    assert log.last(2) == ["line from a pipe", "[ktd] still here"]
    assert any("keeping only the in-memory tail" in line for line in log.tail)


def test_runaway_line_is_cut(tmp_path: Path) -> None:
    log = EngineLog(tmp_path / "a.log")
    assert log.feed(b"y" * 70000) == ["y" * 70000]
    assert log.last(0) == []
