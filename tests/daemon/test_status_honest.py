"""Status as an operator expects (issue 13), through real daemons: phase not log lines,
load ETA from earlier loads, uptime across re-adoption, probe lines out of the logs."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ConfigWriter, sim_model, wait_for

#: Every phase ktd may report for a load: its own steps and SGLang's milestones.
PHASES = {
    "probing engine Python", "preflight", "placing", "loading", "loading weights",
    "weights loaded", "allocating KV cache", "warming up", "adopting",
}  # fmt: skip


def test_phases_eta_and_history_file(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    cfg = write_config([sim_model("eta-kt", env={"KTD_SIM_LOAD_TIME": "0.5"})])
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        with c.subscribe(["engine.eta-kt"], exact=True) as sub:
            first = c.load("eta-kt")
            seen = []
            while (ev := sub.get(timeout=0.3)) is not None:
                seen.append(ev)
        assert first.state == "ready"
        phases = {ev.phase for ev in seen if ev.phase}
        assert phases <= PHASES and "loading weights" in phases, phases
        assert all(ev.load_eta is None for ev in seen)  # never loaded before: no ETA
        history = json.loads((Path(d.env["KTD_STATE_DIR"]) / "load_history.json").read_text())
        [took] = history["loads"]["eta-kt"]
        assert took >= 0.5
        c.evict("eta-kt")
        [stopped] = c.status("eta-kt")
        assert stopped.load_eta == took  # known before the next load starts
        with c.subscribe(["engine.eta-kt"], exact=True) as sub:
            c.load("eta-kt", wait=False)
            starting = wait_for(
                lambda: next(
                    (e for e in iter(lambda: sub.get(timeout=0.2), None) if e.state == "starting"),
                    None,
                ),
                what="a starting event",
            )
        assert starting.load_eta == took and starting.load_started
        [info] = c.status("eta-kt")
        if info.state == "starting":
            assert info.load_started and info.phase in PHASES
        wait_for(lambda: c.status("eta-kt")[0].state == "ready", what="ready")
    r = d.ktctl("status")
    assert r.returncode == 0
    header, row = r.stdout.splitlines()
    assert header.split()[:3] == ["ALIAS", "STATE", "PHASE"] and "UNTIL" in header
    assert row.split()[:3] == ["eta-kt", "ready", "-"]
    doc = json.loads(d.ktctl("status", "--json").stdout)
    [e] = doc["engines"]
    contract = ("alias", "state", "pid", "port", "argv", "numa_nodes", "gpus", "since")
    added = ("started_at", "ttl", "expires_at", "load_eta", "phase")
    for key in (*contract, "reason", "in_flight", "leases", *added):
        assert key in e, key


def test_ttl_expiry_and_last_used_shown(write_config: ConfigWriter, daemon_factory: Any) -> None:
    cfg = write_config([sim_model("ttl-kt", ttl=600)])
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        c.load("ttl-kt")
        [e] = c.status("ttl-kt")
    assert e.ttl == 600 and e.expires_at is not None and e.last_used is not None
    assert e.expires_at == e.last_used + 600
    assert "in 9m" in d.ktctl("status").stdout


def test_uptime_kept_across_readoption(write_config: ConfigWriter, daemon_factory: Any) -> None:
    cfg = write_config(
        [sim_model("up-kt")], daemon={"keep_engines_on_exit": True, "hang_timeout": 10}
    )
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        before = c.load("up-kt")
    assert before.started_at
    assert d1.stop(signal.SIGTERM) == 0
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        now = wait_for(lambda: (s := c.status("up-kt")[0]).state == "ready" and s, what="adopted")
        assert now.pid == before.pid and now.started_at == before.started_at
        c.evict("up-kt")


def test_probe_access_lines_kept_out_of_logs(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config([sim_model("quiet-kt")], daemon={"health_interval": 0.2})
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c, c.subscribe(["log.quiet-kt"], exact=True) as sub:
        c.load("quiet-kt")
        wait_for(
            lambda: "GET /health" in "\n".join(c.logs("quiet-kt", 500, probes=True)),
            what="a health check line",
        )
        lines = []
        while (ev := sub.get(timeout=0.3)) is not None:
            lines += ev.lines
    assert lines and not any("GET /health" in ln or "GET /v1/models" in ln for ln in lines)
    plain = d.ktctl("logs", "quiet-kt", "-n", "500").stdout
    assert "GET /health" not in plain and "GET /v1/models" not in plain
    assert "Load weight begin" in plain
    assert "GET /health?ktd=probe" in d.ktctl("logs", "quiet-kt", "-n", "500", "--probes").stdout
    # Somebody else's health check (a router, a person with curl) is not ktd's: it stays.
    with d.client() as c:
        [e] = c.status("quiet-kt")
        assert httpx.get(f"{e.url}/health", timeout=10).status_code == 200
        wait_for(
            lambda: any('"GET /health HTTP' in ln for ln in c.logs("quiet-kt", 500)),
            what="the client's own health check in the log",
        )
