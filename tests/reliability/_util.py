"""Helpers shared by the reliability tests: process-table views and polling.

Everything here only *observes* (``/proc``, ``/proc/net/tcp``); processes are
started by the shared fixtures in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from tests.conftest import FAST_DAEMON, marked_processes  # noqa: F401  (re-exported)
from tests.hypo import budget

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.03)


def engine_procs() -> dict[int, str]:
    """Live processes of this test run that carry ktd's engine marker: pid -> marker value."""
    out = {}
    for pid, _ in marked_processes():
        value = proctree.environ_get(pid, ENGINE_MARK)
        if value is not None:
            out[pid] = value
    return out


def session_of(pid: int) -> set[int]:
    """Live (non-zombie) processes whose session is ``pid``'s."""
    return {
        p.pid for p in proctree.all_procs().values() if p.sid == pid and p.state not in ("Z", "X")
    }


def alive(pid: int) -> bool:
    info = proctree.read_stat(pid)
    return info is not None and info.state not in ("Z", "X")


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """What an OOM killer or an operator's ``kill -9 -PGID`` does to an engine."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def listening_ports() -> set[int]:
    """TCP ports in LISTEN state on this host (IPv4 and IPv6)."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":  # TCP_LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def status_view(client: Any) -> dict[str, tuple[Any, ...]]:
    """The parts of ``status`` that must not change unless someone acted on an engine."""
    return {
        e.alias: (e.state, e.pid, e.port, e.in_flight, e.restarts, e.reason, e.stale)
        for e in client.status()
    }


def run_against_daemon(machine: type[Any], d: Any, examples: int, steps: int) -> None:
    """A process-level hypothesis machine over the live daemon ``d``: then ``d`` must
    still run, its log hold no traceback, and no engine process be left."""
    from hypothesis import HealthCheck
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine,
        settings=budget(
            examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert d.proc.poll() is None, d.output()
    with d.client() as c:
        c.evict(all=True, force=True)
    log = d.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
    assert engine_procs() == {}
