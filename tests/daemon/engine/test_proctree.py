"""/proc facts: descendants, identity, ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from ktd.core.exits import signal_name
from ktd.daemon.engine import proctree


def test_descendants_and_identity() -> None:
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(30)']); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:

        def kids() -> list[proctree.ProcInfo]:
            return proctree.descendants(proc.pid)

        import time

        deadline = time.monotonic() + 5
        while not kids() and time.monotonic() < deadline:
            time.sleep(0.02)
        [child] = kids()
        assert child.sid == proc.pid and child.pgid == proc.pid
        info = proctree.read_stat(proc.pid)
        assert info is not None and proctree.alive((proc.pid, info.start))
        assert not proctree.alive((proc.pid, info.start + 1))
        assert proctree.environ_get(proc.pid, "PATH") == os.environ.get("PATH")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_an_environ_variable_first_in_the_middle_last_empty_or_absent() -> None:
    raw = b"KTDX_A=1\0PATH=/bin\0KTDX_AB=no\0KTDX_B=\0KTDX_C=x=y"
    got = {k: proctree._value(raw, k) for k in ("KTDX_A", "PATH", "KTDX_B", "KTDX_C", "KTDX_D")}
    assert got == {"KTDX_A": "1", "PATH": "/bin", "KTDX_B": "", "KTDX_C": "x=y", "KTDX_D": None}
    assert proctree._value(b"KTDX_AB=no\0", "KTDX_A") is None  # a name that only begins so


def test_marked_finds_the_processes_that_set_a_variable_with_their_values() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTDX_MARK")}
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    one = subprocess.Popen(sleeper, env={**env, "KTDX_MARK": "one"})
    other = subprocess.Popen(sleeper, env={**env, "KTDX_MARKED": "no"})
    try:
        found = proctree.marked("KTDX_MARK")
        assert found.get(one.pid) == "one" and other.pid not in found
        assert found.get(one.pid) == proctree.environ_get(one.pid, "KTDX_MARK")
    finally:
        for p in (one, other):
            p.kill()
            p.wait()


def test_port_free_and_pick() -> None:
    port = proctree.pick_port("127.0.0.1")
    assert proctree.port_free("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not proctree.port_free("127.0.0.1", port)
    assert signal_name(15) == "SIGTERM" and signal_name(999) == "999"


def test_pidfd_of_is_of_the_process_seen_and_readable_once_it_exits() -> None:
    import select

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    try:
        info = proctree.read_stat(proc.pid)
        assert info is not None
        assert proctree.pidfd_of((proc.pid, info.start + 1)) is None  # another process
        fd = proctree.pidfd_of((proc.pid, info.start))
        assert fd is not None
        try:
            assert select.select([fd], [], [], 0)[0] == []
            assert proc.stdin is not None
            proc.stdin.close()  # it exits
            assert select.select([fd], [], [], 10)[0] == [fd]
        finally:
            os.close(fd)
    finally:
        proc.wait()
    assert proctree.pidfd_of((proc.pid, info.start)) is None
