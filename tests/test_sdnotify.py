"""sd_notify over a real datagram socket."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from ktd.sdnotify import notify, watchdog_interval


def test_notify_sends_a_datagram() -> None:
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    path = d / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        assert notify("READY=1", {"NOTIFY_SOCKET": str(path)})
        assert s.recv(100) == b"READY=1"
    assert not notify("READY=1", {})
    assert not notify("READY=1", {"NOTIFY_SOCKET": str(d / "gone")})


def test_watchdog_interval() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "2000000"}) == 1.0
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "x"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "2", "WATCHDOG_PID": str(os.getpid())}) == 1e-6
    assert watchdog_interval({}) is None


def test_the_frontend_notifies_through_the_shared_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ktd frontend`` says READY=1 with ``ktd.sdnotify`` too (it imports nothing of the
    daemon, issue 45): the datagram reaches the socket systemd names."""
    from ktd.frontend import main as frontend_main

    path = Path(tempfile.mkdtemp(dir="/tmp")) / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        frontend_main._notify("READY=1\nSTATUS=serving")
        assert s.recv(100) == b"READY=1\nSTATUS=serving"
