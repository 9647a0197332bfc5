"""EngineLog: the file the engine writes, followed for the tail; rotation; failures."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ktd.daemon.engine.log import EngineLog


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


def test_the_bar_being_drawn_is_read_before_its_line_ends(tmp_path: Path) -> None:
    """tqdm ends a bar's line only when it closes: its frames so far are ``drawing()``."""
    log = EngineLog(tmp_path / "a.log")
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    assert log.drawing() == ""
    os.write(fd, b"done\n\rLoading safetensors checkpoint shards:   0% Completed | 0/4")
    assert log.poll() == ["done"]
    assert log.drawing().endswith("0% Completed | 0/4")
    os.write(fd, b"\rLoading safetensors checkpoint shards:  50% Completed | 2/4\r")
    assert log.poll() == []
    assert "50% Completed" in log.drawing()
    os.write(fd, b"Loading safetensors checkpoint shards: 100% Completed | 4/4\n")
    assert log.poll() == ["Loading safetensors checkpoint shards: 100% Completed | 4/4"]
    assert log.drawing() == ""
    os.close(fd)


def test_each_published_batch_carries_the_count_the_tail_is_read_at(tmp_path: Path) -> None:
    """``Event.upto`` and ``LogsReply.upto``: a follower's seam is a count, not text."""
    counts: list[tuple[int, list[str]]] = []
    log = EngineLog(tmp_path / "a.log", tail=3)
    log.publish = lambda lines: counts.append((log.count, lines))
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    os.write(fd, b"x\nx\n")
    log.poll()
    log.note("x")
    os.write(fd, b"y\n")
    log.poll()
    assert counts == [(2, ["x", "x"]), (3, ["[ktd] x"]), (4, ["y"])]
    assert log.count == 4 and len(log.tail) == 3  # the count goes on past the tail's size
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


def test_deleted_log_is_still_followed_and_bounded(tmp_path: Path) -> None:
    """Issue 12, attack 7: rotation follows the fd; a deleted file does not grow forever."""
    path = tmp_path / "a.log"
    log = EngineLog(path, max_bytes=1000, backups=1)
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    path.unlink()
    for i in range(50):
        os.write(fd, f"line {i} ".encode() + b"x" * 100 + b"\n")
        log.poll()
        assert os.fstat(fd).st_size < 1200, i
    assert log.detached()
    assert any("was removed or replaced" in ln for ln in log.tail)
    assert log.last(1)[0].startswith("line 49 ")
    assert (tmp_path / "a.log.1").stat().st_size >= 1000  # rotated into the backup
    log.note("a note goes to the engine's own file")
    assert log.last(1) == ["[ktd] a note goes to the engine's own file"]
    os.close(fd)


def test_adopt_output_follows_the_process_stdout_and_backfills(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "a.log"
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nprint('before restart', flush=True)\n"
            "sys.stdin.readline()\nprint('after restart', flush=True)\ntime.sleep(30)",
        ],
        stdout=out,
        stdin=subprocess.PIPE,
        text=True,
    )
    os.close(out)
    try:
        deadline = time.monotonic() + 10
        while b"before" not in path.read_bytes():
            assert time.monotonic() < deadline
        path.unlink()  # nobody can find it by name any more
        log = EngineLog(path)
        assert log.adopt_output(proc.pid)
        log.start_following(from_end=True)
        assert log.last(5) == ["before restart"]
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        while "after restart" not in log.last(1):
            log.poll()
            assert time.monotonic() < deadline
        log.stop_following()
    finally:
        proc.kill()
        proc.wait()


def _shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs (which cannot collapse a file's head), removed afterwards."""
    shm = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path
    try:
        yield shm
    finally:
        if shm != tmp_path:
            shutil.rmtree(shm)


@pytest.fixture(params=["collapse", "copytruncate"])
def log_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """Both ways of cutting a log: in place on ext4/xfs (here: the tmp dir), and
    logrotate's copytruncate where the filesystem refuses (tmpfs)."""
    if request.param == "collapse":
        if _cannot_collapse(tmp_path):
            pytest.skip("this filesystem cannot collapse a file's head")
        yield tmp_path
    else:
        yield from _shm_dir(tmp_path)


def _cannot_collapse(where: Path) -> bool:
    from ktd.daemon.engine.log import _collapse

    probe = where / "collapse-probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 3 * 65536)
        return not _collapse(fd, 65536)
    finally:
        os.close(fd)
        probe.unlink()


def test_a_line_written_while_rotating_is_neither_lost_nor_doubled(log_dir: Path) -> None:
    """Issue 31, the lost log line: the engine wrote between ktd's read and the cut.

    ``publish`` runs inside ``poll`` after its read and before the rotation, exactly
    where an engine's write raced the old copytruncate (the line went to the backup
    but never to the tail)."""
    path = log_dir / "a.log"
    log = EngineLog(path, max_bytes=16384, backups=1, tail=10_000)
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    written: list[str] = []

    def write(n: int) -> None:
        line = f"{n:05d} ".ljust(1000, "x")
        written.append(line)
        os.write(fd, line.encode() + b"\n")

    def racing(lines: list[str]) -> None:
        if len(written) < 60:
            write(len(written))  # while ktd is between its read and the rotation

    log.publish = racing
    while len(written) < 60:
        write(len(written))
        log.poll()
    log.poll()
    assert list(log.tail) == written
    # Nothing lost on disk either: the backup ends where the file begins.
    on_disk = (path.with_name("a.log.1").read_bytes() + path.read_bytes()).decode()
    assert on_disk.endswith("\n".join(written[-3:]) + "\n")
    assert os.fstat(fd).st_size < 16384 + 65536
    os.close(fd)


def test_collapsed_rotation_keeps_the_file_and_backup_contiguous(log_dir: Path) -> None:
    """Whichever way the file is cut, the backup holds exactly what left it: ``cat
    a.log.1 a.log`` is the engine's output since the last rotation, whole."""
    path = log_dir / "a.log"
    log = EngineLog(path, max_bytes=8192, backups=1)
    fd = log.open_for_engine()
    assert fd is not None
    log.start_following(from_end=True)
    out = b"".join(f"line {i:04d} {'y' * 40}\n".encode() for i in range(400))
    for i in range(0, len(out), 700):
        os.write(fd, out[i : i + 700])
        log.poll()
    joined = path.with_name("a.log.1").read_bytes() + path.read_bytes()
    assert out.endswith(joined)
    assert len(joined) >= 8192 and path.stat().st_size < 8192 + 700
    assert log.last(1) == ["line 0399 " + "y" * 40]
    os.close(fd)
