"""State file: whole-or-nothing writes, corrupt files set aside, ownership by marker."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.pool import statefile


def test_roundtrip_and_garbage(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    rec = statefile.EngineRecord(
        alias="a", pid=1, start=2, engine_id="k/a@1", port=3, argv=["x"], numa_nodes=[0]
    )
    statefile.write(path, statefile.StateFile(daemon_pid=9, engines=[rec]))
    assert statefile.read(path).engines == [rec]
    assert not list(tmp_path.glob(".*.tmp"))
    path.write_text("{not json")
    assert statefile.read(path).engines == []
    assert statefile.read(tmp_path / "missing.json").engines == []


def test_same_process_checks_all_three() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        info = proctree.read_stat(proc.pid)
        assert info is not None
        argv = proctree.cmdline(proc.pid)
        good = statefile.EngineRecord(
            alias="a", pid=proc.pid, start=info.start, engine_id="x", port=1, argv=argv
        )
        assert statefile.same_process(good)
        assert not statefile.same_process(msgspec.structs.replace(good, start=info.start + 1))
        assert not statefile.same_process(msgspec.structs.replace(good, argv=["other"]))
    finally:
        proc.kill()
        proc.wait()
    assert not statefile.same_process(good)


def test_instance_key_is_stable_per_directory(tmp_path: Path) -> None:
    assert statefile.instance_key(tmp_path) == statefile.instance_key(tmp_path / ".")
    assert statefile.instance_key(tmp_path) != statefile.instance_key(tmp_path / "x")
    assert os.sep not in statefile.instance_key(tmp_path)


# ---------------------------------------------------------------- whole or nothing


def _rec(alias: str = "a") -> statefile.EngineRecord:
    return statefile.EngineRecord(
        alias=alias, pid=1, start=2, engine_id=f"k/{alias}@1", port=3, argv=["x"]
    )


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: Any) -> None:
    """os.write may write less than asked; every byte must still reach the file."""
    real = os.write

    def dribble(fd: int, data: Any) -> int:
        return real(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", dribble)
    state = statefile.StateFile(engines=[_rec(f"m{i}") for i in range(20)])
    statefile.write(tmp_path / "engines.json", state)
    monkeypatch.undo()
    assert statefile.read(tmp_path / "engines.json") == state


def test_enospc_keeps_the_old_file_whole_and_removes_the_temp(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 12, attack 1 in miniature: a write that fills the disk half-way."""
    path = tmp_path / "engines.json"
    old = statefile.StateFile(engines=[_rec("old")])
    statefile.write(path, old)
    real = os.write
    calls = {"n": 0}

    def full_after_4k(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real(fd, bytes(data[:4096]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_after_4k)
    with pytest.raises(OSError) as info:
        statefile.write(path, statefile.StateFile(engines=[_rec(f"m{i}" * 40) for i in range(60)]))
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert statefile.read(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines.json"]


def test_load_sets_a_corrupt_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    path.write_bytes(statefile.encode(statefile.StateFile(engines=[_rec()]))[:25])
    got = statefile.load(path, now=0)
    assert not got.trusted and got.state.engines == []
    assert got.set_aside == tmp_path / "engines.json.corrupt-19700101T000000"
    assert got.problem and "corrupt" in got.problem and got.set_aside.name in got.problem
    assert not path.exists() and got.set_aside.exists()
    path.write_text("{")  # a second one in the same second does not overwrite the first
    again = statefile.load(path, now=0)
    assert again.set_aside and again.set_aside != got.set_aside and got.set_aside.exists()
    missing = statefile.load(tmp_path / "none.json")
    assert missing.trusted and missing.problem is None


def test_remove_stale_temps_only_removes_ours(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    (tmp_path / ".engines.json.123.tmp").write_text("half")
    (tmp_path / ".other.json.1.tmp").write_text("keep")
    assert statefile.remove_stale_temps(path) == [tmp_path / ".engines.json.123.tmp"]
    assert (tmp_path / ".other.json.1.tmp").exists()


def test_ownership_needs_the_marker(tmp_path: Path) -> None:
    """pid + start time + cmdline of a foreign process are not ownership."""
    env = {**os.environ, ENGINE_MARK: "k/a@1"}
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        recs = {}
        for name, proc in (("ours", ours), ("foreign", foreign)):
            info = proctree.read_stat(proc.pid)
            assert info is not None
            recs[name] = statefile.EngineRecord(
                alias="a",
                pid=proc.pid,
                start=info.start,
                engine_id="k/a@1",
                port=1,
                argv=proctree.cmdline(proc.pid),
            )
        assert statefile.same_process(recs["foreign"])
        assert not statefile.ownership(recs["foreign"])
        assert statefile.ownership(recs["ours"])
        assert not statefile.ownership(msgspec.structs.replace(recs["ours"], engine_id="k/a@2"))
    finally:
        for proc in (ours, foreign):
            proc.kill()
            proc.wait()
