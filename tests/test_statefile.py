"""State file: atomic writes, and process identity by pid + start time + cmdline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec

from ktd import proctree, statefile


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
