"""ktd.pin: affinity and memory binding set before exec, inherited by the engine's children."""

from __future__ import annotations

import os
import subprocess
import sys

from ktd.pin import bind_memory, parse_list


def test_parse_list() -> None:
    assert parse_list("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert parse_list("") == []


def test_exec_with_affinity_and_children_inherit() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (
        "import os, subprocess, sys;"
        "print(sorted(os.sched_getaffinity(0)));"
        "print(subprocess.run([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)"
        ".stdout.strip())"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ktd.pin",
            "--cpus",
            str(cpu),
            "--mems",
            "0",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = r.stdout.strip().splitlines()
    assert lines[-2:] == [f"[{cpu}]", f"[{cpu}]"]


def test_bad_usage() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ktd.pin", "--cpus", "0"], capture_output=True, text=True
    )
    assert r.returncode == 2
    r = subprocess.run(
        [sys.executable, "-m", "ktd.pin", "--", "/nonexistent/bin"], capture_output=True, text=True
    )
    assert r.returncode == 127 and "cannot run" in r.stderr


def test_bind_memory_to_node0() -> None:
    assert bind_memory([0]) is None or "unsupported" in (bind_memory([0]) or "")
