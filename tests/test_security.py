"""Security: the control socket is ours alone, and config values never reach a shell."""

from __future__ import annotations

import json
import os
import pwd
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ConfigWriter, sim_model


def as_user(uid: int, gid: int, fn: Any) -> int:
    """Run ``fn`` in a forked child with another uid (the interpreter under /root may not be
    executable by that user, so no exec); returns the child's exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_control_socket_refuses_another_user(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    d = daemon_factory(write_config([sim_model("a-kt")]))
    nobody = pwd.getpwnam("nobody")
    assert (d.socket.parent.stat().st_mode & 0o777) == 0o700

    def raw_connect() -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(d.socket))
            except PermissionError:
                return 7
        return 0

    def ktctl_probe() -> int:
        from ktctl.client import DaemonUnreachable, probe

        try:
            probe(d.socket)
        except DaemonUnreachable as exc:
            return 7 if "ermission" in str(exc) else 8
        return 0

    assert as_user(nobody.pw_uid, nobody.pw_gid, raw_connect) == 7
    assert as_user(nobody.pw_uid, nobody.pw_gid, ktctl_probe) == 7
    with d.client() as c:
        assert c.ping()


def test_config_values_never_reach_a_shell(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    record = tmp_path / "rec.json"
    evil = f"{tmp_path}/x; touch {pwned} $(touch {pwned}) `touch {pwned}`"
    # A real model dir by that name: preflight refuses paths that do not exist.
    Path(evil).mkdir(parents=True)
    (Path(evil) / "config.json").write_text("{}")
    entry = sim_model("evil-kt", record=record)
    entry["path"] = evil
    entry["kt"]["extra_args"] = f"--kt-method 'AMX INT4; touch {pwned}'"
    entry["kt"]["extra_env"]["EVIL"] = f"$(touch {pwned})"
    d = daemon_factory(write_config([entry]))
    with d.client(timeout=60) as c:
        c.load("evil-kt")
        rec = json.loads(record.read_text())
        args = rec["args"]
        assert args[args.index("--model") + 1] == evil
        assert args[-4:-2] == ["--kt-method", f"AMX INT4; touch {pwned}"]
        assert args[-2] == "--config"  # the engine's key file (issue 32)
        c.evict("evil-kt")
    assert not pwned.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_use_an_engine(write_config: ConfigWriter, daemon_factory: Any) -> None:
    """Issue 32: uid 65534 got 200 from an engine's port and could generate past every
    limit. Now the engine wants its key, which that user can read nowhere: not in the
    file (0600 in a 0700 dir), not on the command line."""
    from ktd.daemon.engine.key import key_of_argv

    d = daemon_factory(write_config([sim_model("own-kt")]))
    with d.client(timeout=60) as c:
        e = c.load("own-kt")
    key, key_file = key_of_argv(e.argv)
    assert key and key_file is not None and e.port
    nobody = pwd.getpwnam("nobody")

    def get(path: str, key_: str | None = None) -> int:
        with socket.create_connection(("127.0.0.1", e.port), timeout=10) as s:
            auth = f"authorization: Bearer {key_}\r\n" if key_ else ""
            s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n".encode())
            head = s.recv(64)
        return int(head.split()[1])

    def as_nobody() -> int:
        if get("/v1/models") != 401 or get("/health") != 200:
            return 3
        try:
            key_file.read_text()
        except PermissionError:
            pass
        else:
            return 4
        with open(f"/proc/{e.pid}/cmdline", "rb") as f:
            if key.encode() in f.read():
                return 5
        return 0

    "127.0.0.1".encode("idna")  # the codec a connect needs, loaded before the fork: the
    # interpreter's files under /root are not that user's to read
    assert as_user(nobody.pw_uid, nobody.pw_gid, as_nobody) == 0
    assert get("/v1/models", key) == 200  # ktd's user, with the key
