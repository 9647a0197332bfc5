"""Doctor checks against fixture machines and fixture model specs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktctl.render import doctor_failed, doctor_text
from ktd.core.config import ModelSpec
from ktd.core.doctor import collect, model_checks, python_checks, report
from ktd.core.machinecheck import cpu_checks, gpu_checks, numa_checks
from ktd.core.topology import Topology
from ktd.core.verdict import Check
from ktd.topology import read_topology
from tests.fixtures.topology import (
    TWO_H100,
    FakeRun,
    build,
    build_epyc,
    build_laptop,
    build_xeon,
    smi_csv,
    xeon_machine,
)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


@pytest.fixture
def xeon(tmp_path: Path) -> Topology:
    return read_topology(build_xeon(tmp_path), run=FakeRun(smi_csv(TWO_H100)))


@pytest.fixture
def epyc(tmp_path: Path) -> Topology:
    return read_topology(build_epyc(tmp_path), nvidia_smi=None)


@pytest.fixture
def laptop(tmp_path: Path) -> Topology:
    return read_topology(build_laptop(tmp_path), run=FakeRun(exc=FileNotFoundError()))


def spec(**kw: Any) -> ModelSpec:
    base: dict[str, Any] = {
        "alias": "ds-kt",
        "backend": "kt",
        "path": "/models/ds",
        "served": True,
        "source": "models.json: $[0]",
        "kt_weight_path": "/models/ds-kt",
        "extra_args": ("--kt-num-gpu-experts", "0"),
    }
    base.update(kw)
    return ModelSpec(**base)


def all_exist(_: str) -> bool:
    return True


def port_free(_h: str, _p: int) -> bool:
    return True


# ---------------------------------------------------------------- CPU


def test_cpu_amx(xeon: Topology) -> None:
    c = by_name(cpu_checks(xeon))
    assert c["cpu.isa"].status == "ok"
    assert "AMX" in c["cpu.isa"].detail and "AMXINT4" in c["cpu.isa"].detail
    assert "amx build" in c["cpu.isa"].detail
    assert "Xeon" in c["cpu.isa"].detail
    assert c["cpu.cores"].detail.startswith("2 socket(s), 16 physical cores, 32 online CPUs")


def test_cpu_avx512(epyc: Topology) -> None:
    c = by_name(cpu_checks(epyc))["cpu.isa"]
    assert c.status == "ok"
    assert "AVX-512" in c.detail and "no AMX" in c.detail
    assert "avx512_bf16 build" in c.detail
    assert "LLAMAFILE" in c.detail and "RAWINT4" in c.detail


def test_cpu_avx2(laptop: Topology) -> None:
    c = by_name(cpu_checks(laptop))["cpu.isa"]
    assert c.status == "warn"
    assert "AVX2 only" in c.detail and c.advice


def test_cpu_none() -> None:
    topo = Topology((), "Ancient", frozenset({"sse2"}), {})
    c = by_name(cpu_checks(topo))
    assert c["cpu.isa"].status == "fail" and "illegal instruction" in c["cpu.isa"].detail
    assert c["cpu.cores"].status == "fail"


def test_cpu_amx_without_full_avx512() -> None:
    topo = Topology(
        (), "VM", frozenset(["avx2", "avx512f", "avx512bw", "amx_tile", "amx_int8", "amx_bf16"]), {}
    )
    c = by_name(cpu_checks(topo))
    assert c["cpu.isa"].status == "ok"
    assert c["cpu.amx_variant"].status == "warn"


@pytest.mark.parametrize(
    ("builder", "isa", "status"),
    [(build_xeon, "amx", "ok"), (build_epyc, "avx512", "ok"), (build_laptop, "avx2", "warn")],
)
def test_isa_verdict_matches_flags(tmp_path: Path, builder: Any, isa: str, status: str) -> None:
    topo = read_topology(builder(tmp_path), nvidia_smi=None)
    assert topo.isa() == isa
    assert by_name(cpu_checks(topo))["cpu.isa"].status == status


# ---------------------------------------------------------------- NUMA


def test_numa_xeon(xeon: Topology) -> None:
    c = by_name(numa_checks(xeon))
    assert c["numa.layout"].status == "ok"
    assert "node0: CPUs 0-7,16-23 (8 cores)" in c["numa.layout"].detail
    assert c["numa.node0.memory"].detail == "200.0 GiB free of 256.0 GiB"
    assert c["numa.node1.memory"].status == "ok"
    assert c["numa.node0.hugepages"].status == "ok"
    assert "1024 x 2 MiB" in c["numa.node0.hugepages"].detail
    assert "numa.node1.hugepages" not in c


def test_numa_off_in_bios(tmp_path: Path) -> None:
    m = xeon_machine()
    m.numa_dirs = False
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    c = by_name(numa_checks(topo))["numa.layout"]
    assert c.status == "warn" and "2 sockets but one NUMA node" in c.detail
    assert "BIOS" in c.advice


def test_numa_low_memory_and_big_hugepages(tmp_path: Path) -> None:
    m = xeon_machine()
    m.mem_free_kb[1] = 5 * 1024 * 1024  # 5 of 256 GiB
    m.hugepages[0] = (65536, 65536)  # 128 GiB reserved, all unused
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    c = by_name(numa_checks(topo))
    assert c["numa.node1.memory"].status == "warn"
    assert c["numa.node0.hugepages"].status == "warn"
    assert "nr_hugepages" in c["numa.node0.hugepages"].advice


def test_numa_no_hugepages(epyc: Topology) -> None:
    c = by_name(numa_checks(epyc))
    assert c["numa.hugepages"].status == "ok"
    assert c["numa.layout"].detail.startswith("4 node(s)")


def test_numa_cpuless_node(tmp_path: Path) -> None:
    m = xeon_machine()
    m.nodes[2] = []
    m.mem_total_kb[2] = m.mem_free_kb[2] = 64 * 1024 * 1024
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    c = by_name(numa_checks(topo))
    assert "numa.cpuless" in c and "node(s) 2" in c["numa.cpuless"].detail


# ---------------------------------------------------------------- GPU


def test_gpu_ok(xeon: Topology) -> None:
    c = gpu_checks(xeon)
    assert [x.name for x in c] == ["gpu0", "gpu1"]
    assert all(x.status == "ok" for x in c)
    assert "NVIDIA H100 80GB HBM3, 81559 MiB" in c[0].detail


def test_gpu_missing(laptop: Topology) -> None:
    [c] = gpu_checks(laptop)
    assert c.status == "warn" and "nvidia-smi not found" in c.detail and c.advice


def test_gpu_busy(tmp_path: Path) -> None:
    run = FakeRun(smi_csv([(0, "L40S", 46068, 40000)]))
    topo = read_topology(build_laptop(tmp_path), run=run)
    assert gpu_checks(topo)[0].status == "warn"


# ---------------------------------------------------------------- model


def test_model_all_good() -> None:
    c = model_checks(spec(), port_free=port_free, exists=all_exist)
    assert all(x.status == "ok" for x in c), c
    assert {x.name for x in c} == {
        "ds-kt.model_path",
        "ds-kt.kt_weight_path",
        "ds-kt.gpu_experts",
        "ds-kt.ctx",
        "ds-kt.port",
    }


def test_model_without_kt_weight_path() -> None:
    c = by_name(model_checks(spec(kt_weight_path=None), port_free=port_free, exists=all_exist))
    k = c["ds-kt.kt_weight_path"]
    assert k.status in ("warn", "fail")
    assert "kt_weight_path" in k.detail and "kt_weight_path" in k.advice


def test_model_kt_weight_path_from_extra_args() -> None:
    s = spec(
        kt_weight_path=None, extra_args=("--kt-weight-path", "/w", "--kt-num-gpu-experts", "4")
    )
    c = by_name(model_checks(s, port_free=port_free, exists=all_exist))
    assert c["ds-kt.kt_weight_path"].status == "ok"
    assert "extra_args" in c["ds-kt.kt_weight_path"].detail


def test_model_missing_paths(tmp_path: Path) -> None:
    weights = tmp_path / "w"
    weights.mkdir()
    s = spec(path=str(tmp_path / "nope"), kt_weight_path=str(tmp_path / "gone"))
    c = by_name(model_checks(s, port_free=port_free))  # real os.path.exists
    assert c["ds-kt.model_path"].status == "fail"
    assert "models.json: $[0]" in c["ds-kt.model_path"].advice
    assert c["ds-kt.kt_weight_path"].status == "fail"
    assert c["ds-kt.kt_weight_path"].advice
    s = spec(path=str(weights), kt_weight_path=str(weights))
    c = by_name(model_checks(s, port_free=port_free))
    assert c["ds-kt.model_path"].status == "ok" and c["ds-kt.kt_weight_path"].status == "ok"


@pytest.mark.parametrize(
    "extra",
    [(), ("--kt-cpuinfer", "8"), ("--kt-num-gpu-experts-x", "1")],
)
def test_model_no_gpu_expert_flags(extra: tuple[str, ...]) -> None:
    c = by_name(model_checks(spec(extra_args=extra), port_free=port_free, exists=all_exist))
    g = c["ds-kt.gpu_experts"]
    assert g.status == "warn"
    assert "kt-kernel silently falls back to GPU-only and runs out of memory" in g.detail


@pytest.mark.parametrize("extra", [("--kt-num-gpu-experts", "8"), ("--kt-gpu-experts-ratio=0.1",)])
def test_model_gpu_expert_flags(extra: tuple[str, ...]) -> None:
    c = by_name(model_checks(spec(extra_args=extra), port_free=port_free, exists=all_exist))
    assert c["ds-kt.gpu_experts"].status == "ok"


@pytest.mark.parametrize(
    ("ctx", "status"),
    [(0, "ok"), (32768, "ok"), (1_048_576, "ok"), (1_048_577, "warn"), (-1, "fail")],
)
def test_model_ctx(ctx: int, status: str) -> None:
    c = by_name(model_checks(spec(ctx=ctx), port_free=port_free, exists=all_exist))
    assert c["ds-kt.ctx"].status == status


def test_model_port() -> None:
    seen: list[tuple[str, int]] = []

    def taken(host: str, port: int) -> bool:
        seen.append((host, port))
        return False

    c = by_name(model_checks(spec(port=0), port_free=taken, exists=all_exist))
    assert c["ds-kt.port"].status == "ok" and seen == []  # port 0 is never probed
    c = by_name(model_checks(spec(port=30000), port_free=taken, exists=all_exist))
    assert c["ds-kt.port"].status == "fail" and seen == [("127.0.0.1", 30000)]
    assert "127.0.0.1:30000 is in use" in c["ds-kt.port"].detail
    c = by_name(model_checks(spec(port=30000), port_free=taken, exists=all_exist, running=True))
    assert c["ds-kt.port"].status == "ok"
    c = by_name(model_checks(spec(port=30000), port_free=port_free, exists=all_exist))
    assert c["ds-kt.port"].status == "ok"


def test_model_method_vs_cpu(xeon: Topology, epyc: Topology) -> None:
    c = by_name(model_checks(spec(), port_free=port_free, exists=all_exist, topo=epyc))
    assert c["ds-kt.kt_method"].status == "fail"  # default AMXINT4 on a CPU without AMX
    assert "(default)" in c["ds-kt.kt_method"].detail
    s = spec(extra_args=("--kt-num-gpu-experts", "0", "--kt-method", "LLAMAFILE"))
    c = by_name(model_checks(s, port_free=port_free, exists=all_exist, topo=epyc))
    assert c["ds-kt.kt_method"].status == "ok"
    c = by_name(model_checks(spec(), port_free=port_free, exists=all_exist, topo=xeon))
    assert c["ds-kt.kt_method"].status == "ok"


def test_model_placement(xeon: Topology) -> None:
    c = by_name(model_checks(spec(), port_free=port_free, exists=all_exist, topo=xeon))
    p = c["ds-kt.placement"]
    assert p.status == "ok" and "--kt-numa-nodes 1" in p.detail
    c = by_name(model_checks(spec(numa=[4]), port_free=port_free, exists=all_exist, topo=xeon))
    assert c["ds-kt.placement"].status == "fail"
    assert "unknown NUMA node 4" in c["ds-kt.placement"].detail
    s = spec(extra_args=("--kt-num-gpu-experts", "0", "--kt-threadpool-count", "1"), numa="all")
    c = by_name(model_checks(s, port_free=port_free, exists=all_exist, topo=xeon))
    assert c["ds-kt.placement"].status == "warn"
    assert "equal" in c["ds-kt.placement"].advice


# ---------------------------------------------------------------- python probe


def test_python_all_good() -> None:
    probe = {
        "python": "/venv/bin/python",
        "sglang": "0.7.2",
        "sglang_package": "sglang-kt",
        "kt_fork": True,
        "kt_kernel": "0.4.1",
        "kt_flags": ["--kt-numa-nodes", "--kt-weight-path"],
        "error": None,
        "kt_variant": "amx",
        "unknown": 1,
    }
    c = python_checks(probe)
    assert all(x.status == "ok" for x in c)
    assert by_name(c)["python.kt_kernel"].detail == "kt-kernel 0.4.1 (amx)"
    assert by_name(c)["python.sglang"].detail == "sglang-kt 0.7.2 (the kt fork)"
    assert by_name(c)["python.kt_flags"].detail == "declares --kt-numa-nodes --kt-weight-path"


def test_python_upstream_sglang_is_told_apart() -> None:
    c = by_name(
        python_checks(
            {
                "python": "/p",
                "sglang": "0.5.23",
                "sglang_package": "sglang",
                "kt_fork": False,
                "kt_kernel": "0.7.2",
                "kt_flags": ["--kt-cpuinfer", "--kt-weight-path"],
            }
        )
    )
    assert c["python.sglang"].status == "warn" and "not the kt fork" in c["python.sglang"].detail
    assert "pip install sglang-kt" in c["python.sglang"].advice
    unread = by_name(python_checks({"python": "/p", "sglang": "1", "options_error": "boom"}))
    assert unread["python.kt_flags"].status == "warn" and "boom" in unread["python.kt_flags"].detail


def test_python_probe_error() -> None:
    [c] = python_checks(
        {"python": "/nope", "sglang": None, "kt_kernel": None, "kt_flags": None, "error": "ENOENT"}
    )
    assert c.status == "fail" and "/nope" in c.detail and "ENOENT" in c.detail


def test_python_missing_packages() -> None:
    c = by_name(
        python_checks(
            {"python": "/p", "sglang": None, "kt_kernel": None, "kt_flags": None, "error": None}
        )
    )
    assert c["python.sglang"].status == "fail"
    assert c["python.kt_kernel"].status == "fail" and "never builds" in c["python.kt_kernel"].advice
    assert "python.kt_flags" not in c  # nothing to say without SGLang


def test_python_sglang_without_kt_flags() -> None:
    c = by_name(
        python_checks({"python": "/p", "sglang": "0.4", "kt_kernel": "0.4", "kt_flags": []})
    )
    assert (
        c["python.kt_flags"].status == "fail" and "no --kt-* flags" in c["python.kt_flags"].detail
    )
    c = by_name(python_checks({"python": "/p", "sglang": "0.5", "kt_kernel": "0.4"}))
    assert c["python.kt_flags"].status == "warn"


# ---------------------------------------------------------------- report


def test_report_and_exit_code() -> None:
    checks = [
        Check("a", "ok", "fine"),
        Check("b", "warn", "hmm", "do x"),
        Check("c", "fail", "broken", "do y"),
    ]
    rep = report(checks, {"topology": {"isa": "amx"}, "summary": "not clobbered"})
    assert rep["summary"] == {"ok": 1, "warn": 1, "fail": 1}
    assert rep["exit_code"] == 1 and doctor_failed(rep)
    assert rep["topology"] == {"isa": "amx"}
    assert rep["checks"][1] == {"name": "b", "status": "warn", "detail": "hmm", "advice": "do x"}
    json.dumps(rep)
    ok = report(checks[:2], {})
    assert ok["exit_code"] == 0 and not doctor_failed(ok)  # warnings do not fail


def test_the_report_as_ktctl_doctor_prints_it() -> None:
    rep = report(
        [Check("cpu.isa", "ok", "AMX", "ignored"), Check("x.port", "fail", "in use", "free it")],
        {},
    )
    text = doctor_text(rep)
    lines = text.splitlines()
    assert lines[0] == "ok    cpu.isa: AMX" and "ignored" not in text
    assert lines[1] == "fail  x.port: in use"
    assert lines[2].strip() == "-> free it"
    assert lines[-1] == "summary: 1 ok, 1 fail"


def test_collect_end_to_end(xeon: Topology) -> None:
    specs = [
        spec(),
        spec(alias="nokt", kt_weight_path=None, extra_args=()),
        spec(alias="other", backend="ds4", served=False),
    ]
    probe = {"python": "/p", "sglang": "0.5", "kt_kernel": "0.4", "kt_flags": ["--kt-cpuinfer"]}
    checks = collect(xeon, specs, probe, port_free=port_free, exists=all_exist)
    names = [c.name for c in checks]
    assert names[0] == "cpu.isa"
    assert "python.sglang" in names and "ds-kt.placement" in names
    assert not any(n.startswith("other.") for n in names)  # not served by ktd
    rep = report(checks, {"topology": xeon.to_dict()})
    assert rep["summary"]["fail"] == 0
    assert rep["summary"]["warn"] >= 2  # nokt: no kt_weight_path, no gpu-expert flag
    assert rep["exit_code"] == 0 and not doctor_failed(rep)
    json.dumps(rep)
    assert "nokt.kt_weight_path" in doctor_text(rep)


def test_an_old_kt_kernel_that_spins_idle_is_said_for_models_that_sleep() -> None:
    """Issue 40: kt-kernel before 0.5.3 keeps one thread spinning while idle (ktransformers
    #1858, #1898; fixed by #1899): an asleep engine costs the awake one a core."""
    from ktd.core import doctor as d
    from tests.fixtures.specs import kt_spec

    assert d.kt_spins_idle("0.5.2.post1") and d.kt_spins_idle("0.4.0")
    assert not d.kt_spins_idle("0.5.3") and not d.kt_spins_idle("0.7.2")
    assert not d.kt_spins_idle(None) and not d.kt_spins_idle("unknown")
    specs = [kt_spec(alias="s", sleep=True), kt_spec(alias="p")]
    [check] = d.sleep_checks(specs, {"kt_kernel": "0.5.2.post1"})
    assert check.name == "s.sleep" and check.status == "warn" and "0.5.3" in check.advice
    assert d.sleep_checks(specs, {"kt_kernel": "0.7.2"}) == []
