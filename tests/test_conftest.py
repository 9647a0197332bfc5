"""The harness itself: what the processes a test starts inherit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import MARK, SHARED, marked_processes, own_env, wait_for


def test_the_callers_own_engine_variables_stay_out(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {
        "KTD_REAL_CACHE": "/somewhere",
        "CUDA_VISIBLE_DEVICES": "3",
        "SGLANG_ENABLE_TORCH_COMPILE": "1",
        "KT_KERNEL_DEBUG": "1",
    }
    for name, value in gone.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HARNESS_PROBE", "kept")
    env = own_env()
    assert not gone.keys() & env.keys()
    assert env["HARNESS_PROBE"] == "kept"
    assert env[MARK]  # the leak check's marker is what every child must keep


def test_the_leak_check_sees_this_runs_processes_by_their_marker_only() -> None:
    """``marked_processes``: a child of this run (``MARK`` inherited) is found, one with
    another marker or none is not, the module's shared marker only with ``shared``, and
    a process gone (reaped) is no longer listed."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    bare = {k: v for k, v in os.environ.items() if k != MARK}
    procs = {
        "ours": subprocess.Popen(sleeper),
        "bare": subprocess.Popen(sleeper, env=bare),
        "other run": subprocess.Popen(sleeper, env={**bare, MARK: "another-run"}),
        "shared": subprocess.Popen(sleeper, env={**bare, MARK: SHARED}),
    }
    pid = {name: p.pid for name, p in procs.items()}
    try:
        wait_for(lambda: _seen(pid) == {pid["ours"], pid["shared"]}, what="the marked children")
        assert {p for p, _ in marked_processes()} & set(pid.values()) == {pid["ours"]}
        assert _seen(pid) == {pid["ours"], pid["shared"]}
        assert dict(marked_processes())[pid["ours"]] == sleeper
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert not _seen(pid)


def _seen(pid: dict[str, int]) -> set[int]:
    return {p for p, _ in marked_processes(shared=True)} & set(pid.values())
