"""Pinned launches on this machine's real CPUs, dry-run plans and doctor, through ktctl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ktd.core.topology import format_cpulist
from ktd.topology import read_topology
from tests.conftest import ConfigWriter, sim_model


def status_line(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise KeyError(key)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text]
    return out


def test_engine_pinned_to_its_node_with_derived_flags(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    record = tmp_path / "rec.json"
    topo = read_topology()
    node0 = topo.node_cpus([0])
    cfg = write_config(
        [
            sim_model(
                "pin-kt",
                record=record,
                numa=[0],
                kt={"extra_args": ["--kt-cpuinfer", "1", "--kt-num-gpu-experts", "0"]},
            ),
        ]
    )
    d = daemon_factory(cfg)
    r = d.ktctl("load", "pin-kt")
    assert r.returncode == 0, r.stderr + d.output()
    [e] = json.loads(d.ktctl("status", "--json").stdout)["engines"]
    assert e["numa_nodes"] == [0] and e["cpus"] == node0
    # The engine and its scheduler child both carry the affinity (set before exec).
    assert status_line(e["pid"], "Cpus_allowed_list") == format_cpulist(node0)
    for child in children(e["pid"]):
        assert status_line(child, "Cpus_allowed_list") == format_cpulist(node0)
    assert status_line(e["pid"], "Mems_allowed_list")  # exists; binding is per policy
    argv = e["argv"]
    assert argv[argv.index("--kt-numa-nodes") + 1] == "0"
    assert argv[argv.index("--kt-threadpool-count") + 1] == "1"
    # The user's --kt-cpuinfer is kept, the derived one dropped.
    assert argv.count("--kt-cpuinfer") == 1 and argv[argv.index("--kt-cpuinfer") + 1] == "1"
    rec = json.loads(record.read_text())
    assert rec["cpus_allowed"] == node0
    assert d.ktctl("evict", "pin-kt").returncode == 0


def test_dry_run_shows_plan_without_launching(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config([sim_model("a-kt", numa=[0]), sim_model("b-kt", numa=[0], swap=False)])
    d = daemon_factory(cfg)
    r = d.ktctl("load", "--dry-run", "--json", "a-kt")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["ok"] and plan["numa_nodes"] == [0]
    assert plan["argv"][plan["argv"].index("--port") + 1] == "<auto>"
    origins = {f["name"]: f["origin"] for f in plan["flags"]}
    assert origins["--kt-numa-nodes"] == "derived" and origins["--kt-cpuinfer"] == "derived"
    assert "PYTHONPATH" in plan["env"]
    assert json.loads(d.ktctl("status", "--json").stdout)["engines"][0]["state"] == "stopped"
    r = d.ktctl("load", "--dry-run", "a-kt")
    assert r.returncode == 0 and "--kt-numa-nodes" in r.stdout
    # With a-kt running, b-kt (swap: false) is blocked, and the plan names the holder.
    assert d.ktctl("load", "a-kt").returncode == 0
    plan_b = json.loads(d.ktctl("load", "--dry-run", "--json", "b-kt").stdout)["plan"]
    assert not plan_b["ok"] and plan_b["blocked_by"] == ["a-kt"]
    r = d.ktctl("load", "b-kt")
    assert r.returncode == 1 and "busy" in r.stderr and "a-kt" in r.stderr
    # a-kt is untouched by the failed load.
    [a] = [
        e for e in json.loads(d.ktctl("status", "--json").stdout)["engines"] if e["alias"] == "a-kt"
    ]
    assert a["state"] == "ready"
    d.ktctl("evict", "--all")


def test_doctor_json_matches_cpuinfo_and_flags_missing_weights(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    cfg = write_config([sim_model("w-kt", kt={"kt_weight_path": None})])
    d = daemon_factory(cfg)
    r = d.ktctl("doctor", "--json")
    report = json.loads(r.stdout)
    assert report["where"] == "daemon"
    checks = {c["name"]: c for c in report["checks"]}
    isa = report["topology"]["isa"]
    expected = (
        "amx"
        if {"amx_tile", "amx_int8", "amx_bf16"} <= flags
        else "avx512"
        if {"avx512f", "avx512bw"} <= flags
        else "avx2"
        if "avx2" in flags
        else "none"
    )
    assert isa == expected
    weight = checks["w-kt.kt_weight_path"]
    assert weight["status"] in ("warn", "fail") and "kt_weight_path" in weight["detail"]
    assert checks["python.sglang"]["status"] == "ok"
    assert r.returncode == (1 if report["summary"]["fail"] else 0)
