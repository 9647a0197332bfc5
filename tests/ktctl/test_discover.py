"""Which ktd ``ktctl`` talks to when it is not told (``ktctl/discover.py``, issue 43): the
default socket, else a running ``ktd up``'s record, else the system's ktd; never a record
that is stale or not the user's own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ktctl import discover
from ktd import paths, uprecord


@pytest.fixture
def env(rundir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A user (not root) whose runtime dir is ``rundir``: nothing of the machine's own."""
    monkeypatch.setattr(paths, "_is_root", lambda: False)
    monkeypatch.setattr(discover, "SYSTEM_SOCKET", rundir / "system" / "control.sock")
    return {"XDG_RUNTIME_DIR": str(rundir), "HOME": str(rundir)}


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def bind(path: Path, socks: list[socket.socket]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen()
    socks.append(s)
    return path


def test_told_is_told(env: dict[str, str], rundir: Path) -> None:
    assert discover.control_socket("/x/c.sock", env).path == Path("/x/c.sock")
    assert discover.control_socket(None, {**env, "KTD_SOCKET": "ipc:///y"}).path == Path("/y")
    told = {**env, "KTD_RUNTIME_DIR": "/z"}
    assert discover.control_socket(None, told) == discover.SocketChoice(Path("/z/control.sock"))


def test_the_default_when_it_is_there(
    env: dict[str, str], rundir: Path, listening: list[socket.socket]
) -> None:
    default = bind(rundir / "ktd" / "control.sock", listening)
    up = bind(rundir / "demo" / "control.sock", listening)
    uprecord.write(uprecord.record_path(env), uprecord.UpRecord(os.getpid(), up, "127.0.0.1:1"))
    assert discover.control_socket(None, env) == discover.SocketChoice(default)


def test_a_running_ktd_up_is_found_and_said(
    env: dict[str, str], rundir: Path, listening: list[socket.socket]
) -> None:
    up = bind(rundir / "demo" / "control.sock", listening)
    record = uprecord.record_path(env)
    assert record == rundir / "ktd-up.json"
    assert uprecord.write(record, uprecord.UpRecord(os.getpid(), up, "127.0.0.1:1"))
    assert record.stat().st_mode & 0o777 == 0o600
    found = discover.control_socket(None, env)
    assert found.path == up
    assert found.note == (
        f"ktctl: no ktd at {rundir / 'ktd' / 'control.sock'}; "
        f"using the `ktd up` (pid {os.getpid()}) at {up}"
    )
    uprecord.remove(record, os.getpid() + 1)  # not its record: kept
    assert record.exists()
    uprecord.remove(record, os.getpid())
    assert not record.exists()


def test_a_stale_or_foreign_record_is_ignored(
    env: dict[str, str], rundir: Path, listening: list[socket.socket]
) -> None:
    default = rundir / "ktd" / "control.sock"
    up = bind(rundir / "demo" / "control.sock", listening)
    record = uprecord.record_path(env)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    uprecord.write(record, uprecord.UpRecord(int(dead.stdout), up, ""))
    assert discover.control_socket(None, env) == discover.SocketChoice(
        default
    )  # its ktd up is gone
    record.write_text(json.dumps({"pid": os.getpid(), "socket": str(rundir / "nothing")}))
    assert discover.control_socket(None, env) == discover.SocketChoice(default)  # no socket there
    for bad in ("[]", "{", json.dumps({"pid": True, "socket": str(up)})):
        record.write_text(bad)
        assert discover.control_socket(None, env) == discover.SocketChoice(default)
    record.unlink()
    record.symlink_to(rundir / "elsewhere.json")
    (rundir / "elsewhere.json").write_text(json.dumps({"pid": os.getpid(), "socket": str(up)}))
    assert discover.control_socket(None, env) == discover.SocketChoice(default)  # not followed


def test_the_systems_ktd_for_a_user_without_one(
    env: dict[str, str], rundir: Path, listening: list[socket.socket]
) -> None:
    system = bind(discover.SYSTEM_SOCKET, listening)
    assert discover.control_socket(None, env, root=False) == discover.SocketChoice(system)
    default = rundir / "ktd" / "control.sock"
    assert discover.control_socket(None, env, root=True) == discover.SocketChoice(default)
