"""The stop sequence on real processes (``ktd.daemon.engine.kill``): real ``ktd serve``, sim
engines, real signals.

Each engine here leaves a helper behind when its server process exits
(``KTD_SIM_ORPHAN``: no PDEATHSIG, unknown to the engine's own clean-up), the case
where ktd used to wait the whole ``stop_grace`` for processes that serve nothing.
``stop_grace`` is 60 s, so "well under the grace" is a bound no slow machine reaches
by accident: a stop takes the server's drain plus at most the 3 s follow window.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ktd.core.command import ENGINE_MARK
from ktd.core.stop import FOLLOW
from ktd.daemon.engine import proctree
from tests.conftest import ConfigWriter, marked_processes, sim_model, wait_for
from tests.fixtures.topology import build_xeon, smi_csv

GRACE = 60
WELL_UNDER = 15.0  # seconds: the grace is four times more
DAEMON = {"stop_grace": GRACE, "drain_timeout": 5, "health_interval": 0.5}
ONE_GPU = [(0, "NVIDIA H100 80GB HBM3", 81559, 559)]


def engine_pids() -> set[int]:
    return {pid for pid, _ in marked_processes() if proctree.environ_has(pid, ENGINE_MARK)}


def alive(pid: int) -> bool:
    info = proctree.read_stat(pid)
    return info is not None and info.state not in ("Z", "X")


def leaving(alias: str, record: Path, orphan: str = "term", **more: Any) -> dict[str, Any]:
    env = {"KTD_SIM_ORPHAN": orphan, **more.pop("env", {})}
    return sim_model(alias, record=record, env=env, **more)


def orphan_of(record: Path) -> int:
    """The helper's pid (from the sim's start-up record), alive: the case is real."""
    pid = int(json.loads(record.read_text())["orphan_pid"])
    assert alive(pid)
    return pid


@pytest.mark.parametrize("orphan", ["term", "ignore"])
def test_evict_of_an_engine_that_leaves_a_helper_does_not_wait_for_the_grace(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path, orphan: str
) -> None:
    """The server drains and exits at once; its helper gets SIGTERM (and, if it ignores
    it, SIGKILL after the follow window): the evict ends well under ``stop_grace``."""
    rec = tmp_path / "rec.json"
    d = daemon_factory(write_config([leaving("o-kt", rec, orphan)], daemon=DAEMON))
    with d.client(timeout=120) as c:
        c.load("o-kt")
        helper = orphan_of(rec)
        t0 = time.monotonic()
        assert c.evict("o-kt") == ["o-kt"]
        took = time.monotonic() - t0
        log = "\n".join(c.logs("o-kt", 200))
    assert took < WELL_UNDER, (took, log)
    assert "SIGTERM received" in log  # the server drained: SGLang's own shutdown
    assert "SIGTERM to 1 process(es) left after the server exited" in log
    if orphan == "ignore":
        assert f"SIGKILL to 1 process(es) left {FOLLOW:g}s after the server exited" in log
    else:
        assert "SIGKILL to" not in log
    assert not alive(helper) and not engine_pids()


def test_evict_of_an_adopted_engine_with_a_helper_does_not_wait_for_the_grace(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    """``kill -9`` of ktd; the next ktd adopts the engine (no trio process of its own:
    a pidfd) and its evict goes the same way as a spawned one's."""
    rec = tmp_path / "rec.json"
    cfg = write_config([leaving("ad-kt", rec, "ignore")], daemon=DAEMON)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        first = c.load("ad-kt")
    helper = orphan_of(rec)
    d1.wait_recorded("ad-kt", first.pid)  # what the next ktd adopts from
    d1.stop(signal.SIGKILL)
    d2 = daemon_factory(cfg)
    with d2.client(timeout=120) as c:
        wait_for(lambda: c.status("ad-kt")[0].state == "ready", timeout=20, what="adopted")
        assert c.status("ad-kt")[0].pid == first.pid
        t0 = time.monotonic()
        c.evict("ad-kt")
        took = time.monotonic() - t0
        log = "\n".join(c.logs("ad-kt", 200))
    assert took < WELL_UNDER, (took, log)
    assert "stopped (pid" in log or "stopped cleanly" in log
    assert not alive(helper) and not engine_pids()


def test_sigterm_of_ktd_stops_an_engine_with_a_helper_well_under_the_grace(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    """A supervisor that gives ktd 15 s to stop (systemd's default is 90, some give
    less) finds it gone, and the engine's helper with it."""
    rec = tmp_path / "rec.json"
    d = daemon_factory(write_config([leaving("t-kt", rec, "ignore")], daemon=DAEMON))
    with d.client(timeout=60) as c:
        c.load("t-kt")
    helper = orphan_of(rec)
    assert d.stop(signal.SIGTERM, timeout=WELL_UNDER) == 0
    assert not alive(helper) and not engine_pids()


def one_gpu(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """A fixture Xeon with one fake H100, which two engines cannot share."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi_csv(ONE_GPU)}EOF\n")
    smi.chmod(0o755)
    root = build_xeon(tmp_path / "machine")
    return {**env, "KTD_SYSFS_ROOT": str(root), "KTD_NVIDIA_SMI": str(smi)}


def test_a_load_that_stopped_an_engine_with_a_helper_and_crashed_is_reported_promptly(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    """Both engines need the only GPU: loading ``bad`` stops ``old`` (whose helper outlives its
    server) to make room, then ``bad`` crashes during its load: the load fails at once
    after, not a ``stop_grace`` later."""
    rec = tmp_path / "rec.json"
    old = leaving("old-kt", rec, "ignore", gpus=[0])
    bad = sim_model("bad-kt", env={"KTD_SIM_CRASH_DURING_LOAD": "1"}, gpus=[0])
    d = daemon_factory(write_config([old, bad], daemon=DAEMON), env=one_gpu(tmp_path, ktd_env))
    with d.client(timeout=120) as c:
        c.load("old-kt")
        helper = orphan_of(rec)
        t0 = time.monotonic()
        with pytest.raises(Exception) as err:
            c.load("bad-kt")
        took = time.monotonic() - t0
        assert getattr(err.value, "code", None) == "load_failed", err.value
        log = "\n".join(c.logs("old-kt", 200))
    assert took < WELL_UNDER, (took, log)
    assert "evicted to make room for bad-kt" in log and not alive(helper)


async def test_a_port_someone_else_holds_does_not_delay_the_end_of_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: after an engine exited because its port was taken before it bound it
    (``port_taken``), the stop waited 10 s for that port to be free before the retry on
    another port, though the port was a stranger's and no process of the engine was
    left. The port is looked at only while something of the engine outlived its kill."""
    import socket
    import sys

    import trio

    from ktd.daemon.engine import kill
    from ktd.daemon.engine.running import Running

    looked: list[int] = []

    def port_free(host: str, port: int) -> bool:
        looked.append(port)
        return False  # as the blocker makes it: never free

    monkeypatch.setattr(kill.proctree, "port_free", port_free)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        proc = await trio.lowlevel.open_process([sys.executable, "-c", "raise SystemExit(1)"])
        info = proctree.read_stat(proc.pid)
        run = Running(
            pid=proc.pid,
            start=info.start if info else 0,
            engine_id="test/port-taken",
            port=port,
            argv=[sys.executable],
            proc=proc,
        )
        await proc.wait()
        notes: list[str] = []
        await kill.kill_tree(run, grace=0.0, host="127.0.0.1", note=notes.append)
    assert looked == []
    assert run.exited.is_set() and run.returncode == 1
    assert notes[-1] == f"stopped (pid {proc.pid}, exit 1)"
