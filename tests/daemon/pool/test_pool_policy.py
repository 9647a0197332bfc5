"""Pool policy end to end: idle TTL, evict-to-fit, hot reload, events, logs, systemd notify."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ktd.daemon.engine import proctree
from tests.conftest import ConfigWriter, sim_model, wait_for


def state(c: Any, alias: str) -> str:
    return str(c.status(alias)[0].state)


def test_ttl_evicts_idle_engine_never_one_in_flight(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    d = daemon_factory(write_config([sim_model("t-kt", ttl=0.6)]))
    with d.client(timeout=30) as c:
        lease = c.acquire("t-kt", "test-client")
        assert state(c, "t-kt") == "ready"
        for _ in range(8):  # 2 s with a request in flight: never evicted
            c.heartbeat("test-client")
            time.sleep(0.25)
            assert state(c, "t-kt") == "ready"
        c.release(lease.lease)
        released = time.monotonic()
        wait_for(lambda: state(c, "t-kt") == "stopped", timeout=10, what="ttl eviction")
        # Counted from the end of the last request, not from load.
        assert time.monotonic() - released >= 0.5
        assert "ttl" in "\n".join(c.logs("t-kt", 50))


def test_a_swap_whose_new_engine_crashes_brings_back_what_it_stopped(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """Regression: a load that evicted ``acc-main`` to make room and then crashed left the
    box serving nothing. It now starts ``acc-main`` again (it still fits) and says so."""
    crash = {"KTD_SIM_CRASH_DURING_LOAD": 1}
    cfg = write_config(
        [sim_model("acc-main", numa=[0]), sim_model("acc-second", numa=[0], env=crash)]
    )
    d = daemon_factory(cfg)
    from ktctl import KtdError

    with d.client(timeout=60) as c:
        c.load("acc-main")
        with pytest.raises(KtdError) as err:
            c.load("acc-second")
        assert err.value.code == "load_failed" and "started acc-main again" in err.value.message
        wait_for(lambda: state(c, "acc-main") == "ready", timeout=30, what="acc-main back")
        main = c.status("acc-main")[0]
        assert main.evictions == 1 and main.loads == 2
        assert "started again: acc-second" in d.ktctl("logs", "acc-main", "-n", "500").stdout


def test_evict_to_fit_takes_lru_idle_not_busy_or_pinned(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    # Three models on this machine's single NUMA node: only one fits at a time.
    cfg = write_config(
        [
            sim_model("old-kt", numa=[0]),
            sim_model("pinned-kt", numa=[0], pinned=True),
            sim_model("new-kt", numa=[0]),
        ]
    )
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        c.load("old-kt")
        # new-kt needs node 0: old-kt is idle and unpinned → evicted.
        r = d.ktctl("load", "--dry-run", "--json", "new-kt")
        assert json.loads(r.stdout)["plan"]["evict"] == ["old-kt"]
        c.load("new-kt")
        assert state(c, "old-kt") == "stopped" and state(c, "new-kt") == "ready"
        # A busy engine is never evicted: the load waits for it to become idle
        # (queue, don't refuse), saying whom it waits for...
        lease = c.acquire("new-kt", "t")
        from ktctl import KtdError

        with pytest.raises(KtdError) as err:
            c.load("old-kt", timeout=0.5)
        assert err.value.code == "timeout"
        assert state(c, "new-kt") == "ready"
        waiting = c.status("old-kt")[0]
        assert waiting.phase == "waiting for new-kt"
        assert (waiting.step, waiting.waiting_for) == ("waiting", ["new-kt"])  # as data
        # ...and swaps as soon as the holder is idle (the load went on after the timeout).
        c.release(lease.lease)
        wait_for(lambda: state(c, "old-kt") == "ready", timeout=30, what="swap")
        assert state(c, "new-kt") == "stopped"
        assert c.status("new-kt")[0].evictions == 1
        c.evict("old-kt")
        # A pinned engine is never evicted either.
        c.evict("new-kt")
        c.load("pinned-kt")
        with pytest.raises(KtdError) as err:
            c.load("old-kt")
        assert err.value.code == "busy" and "pinned-kt" in err.value.message
        assert state(c, "pinned-kt") == "ready"
        c.evict(all=True)


def test_reload_restarts_only_the_changed_engine(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    models = [sim_model("keep-kt"), sim_model("change-kt", kt={"ctx": 4096})]
    cfg = write_config(models)
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        keep = c.load("keep-kt")
        change = c.load("change-kt")
        models[1]["kt"]["ctx"] = 8192
        models.append(sim_model("added-kt"))
        (cfg.parent / "models.json").write_text(json.dumps(models))
        reply = c.reload()
        assert "restarting: change-kt" in reply.message and "added: added-kt" in reply.message
        wait_for(
            lambda: (
                c.status("change-kt")[0].state == "ready"
                and c.status("change-kt")[0].pid != change.pid
            ),
            timeout=20,
            what="restart",
        )
        new = c.status("change-kt")[0]
        assert new.argv[new.argv.index("--context-length") + 1] == "8192"
        assert c.status("keep-kt")[0].pid == keep.pid  # untouched
        assert c.status("added-kt")[0].state == "stopped"

        # A broken config keeps everything and names the field.
        (cfg.parent / "models.json").write_text(
            json.dumps([*models[:1], {**models[1], "ttl": "soon"}])
        )
        r = d.ktctl("reload")
        assert r.returncode == 1 and "config_error" in r.stderr and "$[1].ttl" in r.stderr
        assert c.status("keep-kt")[0].pid == keep.pid
        assert c.status("change-kt")[0].pid == new.pid
        # Removing a model drains and stops it.
        (cfg.parent / "models.json").write_text(json.dumps(models[:1]))
        assert "removed: change-kt" in c.reload().message
        wait_for(lambda: all(e.alias != "change-kt" for e in c.status()), what="removal")
        assert not proctree.read_stat(new.pid) or proctree.read_stat(new.pid).state == "Z"
        c.evict(all=True)


def test_reload_with_a_request_in_flight_marks_stale_then_restarts(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    models = [sim_model("s-kt", kt={"ctx": 4096})]
    cfg = write_config(models)
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        lease = c.acquire("s-kt", "t")
        pid = c.status("s-kt")[0].pid
        models[0]["kt"]["ctx"] = 2048
        (cfg.parent / "models.json").write_text(json.dumps(models))
        assert "stale until idle: s-kt" in c.reload().message
        time.sleep(0.5)
        e = c.status("s-kt")[0]
        assert e.stale and e.pid == pid and e.state == "ready"
        c.release(lease.lease)
        wait_for(
            lambda: (
                c.status("s-kt")[0].pid not in (None, pid) and c.status("s-kt")[0].state == "ready"
            ),
            timeout=20,
            what="restart",
        )
        assert not c.status("s-kt")[0].stale
        c.evict(all=True)


class Lines:
    """A subprocess's stdout read line by line in a thread, so a test can wait for a
    line instead of sleeping for it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, out: Any) -> None:
        for line in out:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> str:
        self._thread.join(10)
        return self.text()


def test_events_and_logs_follow(write_config: ConfigWriter, daemon_factory: Any) -> None:
    d = daemon_factory(write_config([sim_model("e-kt"), sim_model("w-kt")]))
    ev = subprocess.Popen(
        [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "events", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env=d.env,
    )
    logs = subprocess.Popen(
        [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "logs", "e-kt", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        env=d.env,
    )
    ev_out, logs_out = Lines(ev), Lines(logs)
    try:
        # ``events`` is subscribed once it prints an event: another model's, loaded until
        # one shows (``logs -f`` needs no such wait: it prints the tail before it follows).
        with d.client(timeout=60) as c:

            def seen() -> bool:
                c.load("w-kt")
                c.evict("w-kt")
                return "engine.w-kt" in ev_out.text()

            wait_for(seen, timeout=30, what="ktctl events subscribed")
        assert d.ktctl("load", "e-kt").returncode == 0
        assert d.ktctl("evict", "e-kt").returncode == 0
        wait_for(lambda: "[ktd] stopped" in logs_out.text(), what="logs -f: the stop")

        def stopped_event() -> bool:
            return any(
                e["topic"] == "engine.e-kt" and e.get("state") == "stopped"
                for e in map(json.loads, filter(str.strip, ev_out.lines[:]))
            )

        wait_for(stopped_event, what="events: e-kt stopped")
    finally:
        ev.terminate()
        logs.terminate()
        ev.wait(10)
        logs.wait(10)
    out_ev, out_logs = ev_out.join(), logs_out.join()
    events = [json.loads(line) for line in out_ev.splitlines() if line.strip()]
    states = [e["state"] for e in events if e["topic"] == "engine.e-kt" and e.get("state")]
    assert "starting" in states and "ready" in states and states[-1] == "stopped"
    assert any(e["topic"] == "log.e-kt" for e in events)
    assert "fired up and ready to roll" in out_logs and "[ktd] stopped" in out_logs


def test_systemd_notify_ready_after_socket(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str], runtime_dir: Path
) -> None:
    path = runtime_dir / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    env = dict(ktd_env, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="400000")
    d = daemon_factory(write_config([sim_model("n-kt")]), start=False, env=env)
    d.start(wait=False)
    try:
        msgs = [sock.recv(4096).decode()]
        assert msgs[0].startswith("READY=1")
        # READY=1 only once the control socket answers.
        with d.client() as c:
            assert c.ping()
        watchdogs = 0
        while watchdogs < 2:
            m = sock.recv(4096).decode()
            watchdogs += m == "WATCHDOG=1"
        d.stop()
        while True:
            m = sock.recv(4096).decode()
            if m.startswith("STOPPING=1"):
                break
    finally:
        sock.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_unit_files_verify() -> None:
    root = Path(__file__).resolve().parents[3] / "systemd"
    units = [str(root / "ktd.service"), str(root / "ktd-frontend.service")]
    r = subprocess.run(
        ["systemd-analyze", "verify", *units],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    assert r.returncode == 0, r.stderr
    # Only complaints about this sandbox (no ktd user, no binary) would be tolerable.
    assert "ktd.service" not in r.stderr or "Unknown" not in r.stderr, r.stderr


def test_sighup_reloads(write_config: ConfigWriter, daemon_factory: Any) -> None:
    import signal

    models = [sim_model("h-kt")]
    cfg = write_config(models)
    d = daemon_factory(cfg)
    models.append(sim_model("h2-kt"))
    (cfg.parent / "models.json").write_text(json.dumps(models))
    d.proc.send_signal(signal.SIGHUP)
    with d.client() as c:
        wait_for(lambda: any(e.alias == "h2-kt" for e in c.status()), what="SIGHUP reload")
    # A broken file on SIGHUP is refused and logged; the daemon keeps running.
    (cfg.parent / "models.json").write_text("[{]")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.output(), what="reload error logged")
    with d.client() as c:
        assert {e.alias for e in c.status()} == {"h-kt", "h2-kt"}
