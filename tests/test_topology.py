"""Topology reading on fixture machines and on this machine's real ``/``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ktd.catalog.report import box
from ktd.core.topology import (
    Gpu,
    NumaNode,
    Topology,
    format_cpulist,
    parse_cpulist,
    parse_nvidia_smi,
)
from ktd.topology import read_topology
from tests.fixtures.topology import (
    FOUR_L40S,
    TWO_H100,
    FakeRun,
    build,
    build_epyc,
    build_laptop,
    build_xeon,
    laptop_machine,
    smi_csv,
    xeon_machine,
)

GIB_KB = 1024 * 1024


# ---------------------------------------------------------------- cpulists


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", []),
        ("\n", []),
        ("0", [0]),
        ("0-3", [0, 1, 2, 3]),
        ("0-3,8-11\n", [0, 1, 2, 3, 8, 9, 10, 11]),
        ("0-7,16-23", [*range(8), *range(16, 24)]),
        ("5,3,3-4", [3, 4, 5]),
        (" 1 , 2 ", [1, 2]),
        ("0-15:2/4", [0, 1, 4, 5, 8, 9, 12, 13]),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["a", "1-", "-1", "3-1", "1--2", "0-7:0/4", "0-7:5/4", "1 2"])
def test_parse_cpulist_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0-1"),
        ([3, 1, 2, 2, 0], "0-3"),
        ([0, 1, 2, 3, 8, 9, 10, 11], "0-3,8-11"),
        ([1, 3, 5], "1,3,5"),
    ],
)
def test_format_cpulist(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@given(st.sets(st.integers(min_value=0, max_value=4096)))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == sorted(cpus)
    assert format_cpulist(parse_cpulist(text)) == text  # canonical form is a fixed point


@given(st.lists(st.tuples(st.integers(0, 512), st.integers(0, 64)), max_size=20))
def test_cpulist_parse_then_format_is_canonical(ranges: list[tuple[int, int]]) -> None:
    text = ",".join(f"{lo}-{lo + n}" if n else str(lo) for lo, n in ranges)
    cpus = parse_cpulist(text)
    expected = sorted({c for lo, n in ranges for c in range(lo, lo + n + 1)})
    assert cpus == expected
    assert parse_cpulist(format_cpulist(cpus)) == cpus


# ---------------------------------------------------------------- nvidia-smi


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(smi_csv(TWO_H100))
    assert gpus == (
        Gpu(0, "NVIDIA H100 80GB HBM3", 81559, 4),
        Gpu(1, "NVIDIA H100 80GB HBM3", 81559, 4),
    )


def test_parse_nvidia_smi_variants() -> None:
    text = (
        "1, NVIDIA GH200, [N/A], [N/A]\n"  # noheader, N/A memory, out of order
        "0, Weird, Name, With Commas, 24576, 100\n"  # nounits, commas in the name
        "\n"
    )
    assert parse_nvidia_smi(text) == (
        Gpu(0, "Weird, Name, With Commas", 24576, 100),
        Gpu(1, "NVIDIA GH200", 0, 0),
    )
    assert parse_nvidia_smi("") == ()
    assert parse_nvidia_smi("index, name, memory.total [MiB], memory.used [MiB]\n") == ()


@pytest.mark.parametrize(
    "bad",
    [
        "No devices were found",
        "0, A100",
        "x, A100, 1 MiB, 0 MiB",
        "0, A100, lots MiB, 0 MiB",
    ],
)
def test_parse_nvidia_smi_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_nvidia_smi(bad)


# ---------------------------------------------------------------- fixture machines


def test_laptop(tmp_path: Path) -> None:
    topo = read_topology(build_laptop(tmp_path), nvidia_smi=None)
    assert [n.id for n in topo.nodes] == [0]
    assert topo.nodes[0].cpus == tuple(range(8))
    assert topo.nodes[0].mem_total_kb == 32 * GIB_KB
    assert topo.nodes[0].mem_free_kb == 20 * GIB_KB
    assert topo.physical_cores(range(8)) == [0, 1, 2, 3]
    assert topo.isa() == "avx2"
    assert topo.kt_variant() == "avx2"
    assert topo.isa_extras() == ()
    assert "i7-8650U" in topo.cpu_model
    assert topo.gpus == () and topo.gpu_error is None
    assert topo.packages == (0,)


def test_xeon(tmp_path: Path) -> None:
    run = FakeRun(smi_csv(TWO_H100))
    topo = read_topology(build_xeon(tmp_path), run=run)
    assert run.calls == [
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,memory.used",
            "--format=csv",
        ]
    ]
    assert topo.node_ids == (0, 1)
    assert topo.nodes[0].cpus == (*range(8), *range(16, 24))
    assert topo.nodes[1].cpus == (*range(8, 16), *range(24, 32))
    assert topo.node_cpus([1]) == [*range(8, 16), *range(24, 32)]
    assert topo.node_cpus([0, 1]) == list(range(32))
    # one CPU per physical core: the hyperthread siblings 16-23 collapse onto 0-7
    assert topo.physical_cores(topo.node_cpus([0])) == list(range(8))
    assert topo.physical_cores(topo.node_cpus([1])) == list(range(8, 16))
    assert topo.physical_cores(range(32)) == list(range(16))
    assert topo.core_of[16] == (0, 0) and topo.core_of[24] == (1, 0)
    assert topo.isa() == "amx"
    assert topo.kt_variant() == "amx"
    assert set(topo.isa_extras()) == {"vnni", "vbmi", "bf16"}
    assert topo.packages == (0, 1)
    assert topo.nodes[0].hugepages_total == 1024 and topo.nodes[0].hugepages_free == 1000
    assert topo.nodes[1].hugepages_total == 0
    assert topo.nodes[1].mem_free_kb == 240 * GIB_KB
    assert topo.gpus == (
        Gpu(0, "NVIDIA H100 80GB HBM3", 81559, 4),
        Gpu(1, "NVIDIA H100 80GB HBM3", 81559, 4),
    )
    assert topo.gpu_error is None


def test_epyc(tmp_path: Path) -> None:
    topo = read_topology(build_epyc(tmp_path), run=FakeRun(smi_csv(FOUR_L40S)))
    assert topo.node_ids == (0, 1, 2, 3)
    for n in topo.nodes:
        assert len(n.cpus) == 16
        assert len(topo.physical_cores(n.cpus)) == 8
    assert topo.nodes[2].cpus == (*range(16, 24), *range(48, 56))
    assert topo.isa() == "avx512"
    assert topo.kt_variant() == "avx512_bf16"
    assert "amx_tile" not in topo.flags
    assert len(topo.gpus) == 4
    assert topo.packages == (0,)


def test_node_cpus_unknown_node(tmp_path: Path) -> None:
    topo = read_topology(build_laptop(tmp_path), nvidia_smi=None)
    with pytest.raises(KeyError, match="no NUMA node 3"):
        topo.node_cpus([3])


def test_offline_cpus_excluded(tmp_path: Path) -> None:
    m = xeon_machine()
    m.offline = {5, 21, 30}
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    assert 5 not in topo.nodes[0].cpus and 21 not in topo.nodes[0].cpus
    assert 30 not in topo.nodes[1].cpus
    assert len(topo.cpus) == 29
    # core 5 of socket 0 lost both threads; core 6 of socket 1 (cpus 14, 30) keeps one
    assert topo.physical_cores(topo.node_cpus([0])) == [0, 1, 2, 3, 4, 6, 7]
    assert 14 in topo.physical_cores(topo.node_cpus([1]))


def test_offline_cpus_without_online_file(tmp_path: Path) -> None:
    m = laptop_machine()
    m.offline = {7}
    m.write_online = False
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    assert topo.nodes[0].cpus == tuple(range(7))


def test_no_numa_dirs_is_one_node(tmp_path: Path) -> None:
    m = xeon_machine()
    m.numa_dirs = False
    m.offline = {31}
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    assert len(topo.nodes) == 1
    node = topo.nodes[0]
    assert node.id == 0
    assert node.cpus == tuple(range(31))
    assert node.mem_total_kb == 512 * GIB_KB  # from /proc/meminfo
    assert node.mem_free_kb == 440 * GIB_KB
    assert node.hugepages_total == 1024 and node.hugepages_free == 1000


def test_core_ids_fall_back_to_cpuinfo(tmp_path: Path) -> None:
    m = xeon_machine()
    m.cpu_topology = False
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    assert topo.core_of[24] == (1, 0)
    assert topo.physical_cores(range(32)) == list(range(16))


def test_empty_root_never_raises(tmp_path: Path) -> None:
    topo = read_topology(tmp_path, nvidia_smi=None)
    assert topo.nodes == (NumaNode(0, (), 0, 0, 0, 0),)
    assert topo.isa() == "none"
    assert topo.kt_variant() is None
    assert topo.cpu_model == ""


def test_memory_only_node(tmp_path: Path) -> None:
    m = xeon_machine()
    m.nodes[2] = []  # a CXL/HBM memory expander: memory, no CPUs
    m.mem_total_kb[2] = 64 * GIB_KB
    m.mem_free_kb[2] = 64 * GIB_KB
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    assert topo.node_ids == (0, 1, 2)
    assert topo.node(2).cpus == ()
    assert topo.node(2).mem_total_kb == 64 * GIB_KB


# ---------------------------------------------------------------- GPU probe failures


@pytest.mark.parametrize(
    ("run", "needle"),
    [
        (FakeRun(exc=FileNotFoundError(2, "No such file")), "not found"),
        (FakeRun(exc=PermissionError(13, "Permission denied")), "could not run"),
        (FakeRun(exc=subprocess.TimeoutExpired(["nvidia-smi"], 15)), "did not answer"),
        (
            FakeRun(
                "",
                returncode=9,
                stderr="NVIDIA-SMI has failed because it couldn't "
                "communicate with the NVIDIA driver.\nMore text\n",
            ),
            "exited with 9: NVIDIA-SMI has failed",
        ),
        (FakeRun("No devices were found\n", returncode=6), "No devices were found"),
        (FakeRun("garbage, here\n"), "cannot parse"),
        (FakeRun(""), "listed no GPUs"),
    ],
)
def test_gpu_probe_failures_never_raise(tmp_path: Path, run: FakeRun, needle: str) -> None:
    topo = read_topology(build_laptop(tmp_path), run=run)
    assert topo.gpus == ()
    assert topo.gpu_error is not None and needle in topo.gpu_error


def test_custom_nvidia_smi_path(tmp_path: Path) -> None:
    run = FakeRun(smi_csv(TWO_H100))
    read_topology(build_laptop(tmp_path), nvidia_smi=["/opt/nv/nvidia-smi", "-i", "0"], run=run)
    assert run.calls[0][:3] == ["/opt/nv/nvidia-smi", "-i", "0"]


def test_isa_levels() -> None:
    def topo(flags: str) -> Topology:
        return Topology((), "", frozenset(flags.split()), {})

    assert topo("avx2 avx512f avx512bw amx_tile amx_int8 amx_bf16").isa() == "amx"
    assert topo("avx2 avx512f amx_tile amx_int8").isa() == "avx2"  # partial AMX, no bw
    assert topo("avx2 avx512f avx512bw amx_tile amx_int8").isa() == "avx512"
    assert topo("avx2 avx512f").isa() == "avx2"
    assert topo("sse4_2").isa() == "none"
    assert topo("avx512f avx512bw avx512vnni").isa_extras() == ("vnni",)  # old spelling
    assert topo("avx512f avx512bw avx512_vnni").kt_variant() == "avx512_vnni"
    assert topo("avx512f avx512bw").kt_variant() == "avx512_base"
    # AMX tiles without the full AVX-512 set: kt-kernel falls back below amx
    assert topo("amx_tile amx_int8 amx_bf16 avx512f avx512bw avx2").kt_variant() == "avx512_base"


def test_to_dict(tmp_path: Path) -> None:
    topo = read_topology(build_xeon(tmp_path), run=FakeRun(smi_csv(TWO_H100)))
    d = topo.to_dict()
    assert d["isa"] == "amx"
    assert d["packages"] == 2 and d["cpus"] == 32 and d["physical_cores"] == 16
    assert d["nodes"][0]["cpus"] == "0-7,16-23"
    assert d["nodes"][0]["physical_cores"] == 8
    assert d["gpus"][1]["index"] == 1


def test_cpu_dict_opens_the_doctors_summary_and_the_catalogs_box(tmp_path: Path) -> None:
    topo = read_topology(build_xeon(tmp_path), run=FakeRun(smi_csv(TWO_H100)))
    cpu = topo.cpu_dict()
    assert list(cpu) == ["cpu_model", "isa", "isa_extras", "kt_variant"]
    assert cpu["isa"] == "amx" and cpu["kt_variant"] == "amx"
    assert cpu["isa_extras"] == list(topo.isa_extras())
    for whole in (topo.to_dict(), box(topo)):
        assert list(whole)[:4] == list(cpu) and {k: whole[k] for k in cpu} == cpu


# ---------------------------------------------------------------- this machine


def _proc_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc")
def test_real_machine() -> None:
    topo = read_topology(Path("/"), nvidia_smi=None)
    assert topo.flags == frozenset(f.lower() for f in _proc_flags())
    # os.cpu_count() counts configured CPUs, the topology only online ones
    cpus = topo.cpus
    assert 0 < len(cpus) <= (os.cpu_count() or 0)
    if hasattr(os, "sched_getaffinity"):
        # every CPU we may run on is online, hence in the topology
        assert os.sched_getaffinity(0) <= set(cpus)
    assert len(set(cpus)) == len(cpus)  # no CPU in two nodes
    assert 0 < len(topo.physical_cores(cpus)) <= len(cpus)
    assert topo.nodes and all(n.mem_total_kb > 0 for n in topo.nodes if n.cpus)
    expected = (
        "amx"
        if {"amx_tile", "amx_int8", "amx_bf16"} <= _proc_flags()
        else "avx512"
        if {"avx512f", "avx512bw"} <= _proc_flags()
        else "avx2"
        if "avx2" in _proc_flags()
        else "none"
    )
    assert topo.isa() == expected


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc")
def test_real_machine_gpu_probe_never_raises() -> None:
    topo = read_topology(Path("/"))  # real nvidia-smi, present or not
    assert (topo.gpus == ()) == (topo.gpu_error is not None)
