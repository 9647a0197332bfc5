"""Placement plans on the three fixture machines, eviction choice, user flags, properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ktd.core.placement import Holding, KtFlag, Plan, plan, user_flags
from ktd.core.topology import Gpu, NumaNode, Topology
from ktd.topology import read_topology
from tests.fixtures.topology import (
    FOUR_L40S,
    TWO_H100,
    FakeRun,
    build,
    build_epyc,
    build_laptop,
    smi_csv,
    xeon_machine,
)
from tests.hypo import budget


@pytest.fixture
def laptop(tmp_path: Path) -> Topology:
    return read_topology(build_laptop(tmp_path), nvidia_smi=None)


@pytest.fixture
def xeon(tmp_path: Path) -> Topology:
    return read_topology(build(tmp_path, xeon_machine()), run=FakeRun(smi_csv(TWO_H100)))


@pytest.fixture
def epyc(tmp_path: Path) -> Topology:
    return read_topology(build_epyc(tmp_path), run=FakeRun(smi_csv(FOUR_L40S)))


def H(
    alias: str,
    nodes: tuple[int, ...] = (),
    gpus: tuple[int, ...] = (),
    *,
    in_flight: int = 0,
    pinned: bool = False,
    last_used: float = 0.0,
    state: str = "ready",
    sleeps: bool = False,
) -> Holding:
    return Holding(alias, nodes, gpus, in_flight, pinned, last_used, state, sleeps)


def flags_of(p: Plan) -> dict[str, tuple[tuple[str, ...], str]]:
    return {f.name: (f.values, f.origin) for f in p.flags}


# ---------------------------------------------------------------- user_flags


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {}),
        (["--tp-size", "2"], {"--tp-size": ("2",)}),
        (["--kt-cpuinfer=12"], {"--kt-cpuinfer": ("12",)}),
        (["--kt-numa-nodes", "0", "1"], {"--kt-numa-nodes": ("0", "1")}),
        (
            ["--kt-numa-nodes", "0", "1", "--kt-threadpool-count", "2", "--trust-remote-code"],
            {
                "--kt-numa-nodes": ("0", "1"),
                "--kt-threadpool-count": ("2",),
                "--trust-remote-code": (),
            },
        ),
        (["--kt-numa-nodes=0", "1"], {"--kt-numa-nodes": ("0",)}),  # argparse: '=' is one value
        (["--foo", "-1", "--bar", "-0.5"], {"--foo": ("-1",), "--bar": ("-0.5",)}),
        (["--kt-cpuinfer", "4", "--kt-cpuinfer", "8"], {"--kt-cpuinfer": ("8",)}),  # last wins
        (["stray", "--x", "a=b"], {"--x": ("a=b",)}),
        (["--chat-template", "-"], {"--chat-template": ("-",)}),
        (["--json-model-override-args", '{"a": 1}'], {"--json-model-override-args": ('{"a": 1}',)}),
    ],
)
def test_user_flags(args: list[str], expected: dict[str, tuple[str, ...]]) -> None:
    assert user_flags(args) == expected


# ---------------------------------------------------------------- laptop (1 node, no GPU)


def test_laptop_auto(laptop: Topology) -> None:
    p = plan("m", "auto", "auto", [], laptop, [])
    assert p.ok and p.reason is None
    assert p.numa_nodes == (0,)
    assert p.cpus == tuple(range(8))  # hyperthreads included
    assert p.gpus == ()
    assert dict(p.env) == {}  # no GPU planned: CUDA_VISIBLE_DEVICES left alone
    assert p.argv_flags() == [
        "--kt-numa-nodes",
        "0",
        "--kt-threadpool-count",
        "1",
        "--kt-cpuinfer",
        "4",  # physical cores, not threads
    ]
    assert all(f.origin == "derived" for f in p.flags)


def test_laptop_reserved_cpus_and_cpu_reserve(laptop: Topology) -> None:
    # CPU 0 and its sibling 4 share core 0: reserving CPU 0 removes the whole core
    p = plan("m", "auto", "auto", [], laptop, [], reserved_cpus=[0])
    assert p.cpus == (1, 2, 3, 4, 5, 6, 7)
    assert flags_of(p)["--kt-cpuinfer"] == (("3",), "derived")
    p = plan("m", "auto", "auto", [], laptop, [], cpu_reserve=1)
    assert p.cpus == tuple(range(8))
    assert flags_of(p)["--kt-cpuinfer"] == (("3",), "derived")
    p = plan("m", "auto", "auto", [], laptop, [], reserved_cpus=[0, 4], cpu_reserve=1)
    assert p.cpus == (1, 2, 3, 5, 6, 7)
    assert flags_of(p)["--kt-cpuinfer"] == (("2",), "derived")
    p = plan("m", "auto", "auto", [], laptop, [], cpu_reserve=100)
    assert flags_of(p)["--kt-cpuinfer"] == (("1",), "derived")  # at least 1
    p = plan("m", "auto", "auto", [], laptop, [], reserved_cpus=range(8))
    assert p.ok and p.cpus == ()
    assert flags_of(p)["--kt-cpuinfer"] == (("1",), "derived")
    assert any("reserved" in n for n in p.notes)


def test_laptop_second_engine_busy(laptop: Topology) -> None:
    holding = H("qwen3-kt", (0,), in_flight=2)
    p = plan("m", "auto", "auto", [], laptop, [holding])
    assert not p.ok
    assert p.blocked_by == ("qwen3-kt",)
    assert p.reason == "busy: NUMA node 0 held by qwen3-kt (2 in flight)"
    assert p.argv_flags() == [] and p.cpus == () and p.evict == ()


def test_laptop_gpu_requests_without_gpus(laptop: Topology) -> None:
    p = plan("m", "auto", 1, [], laptop, [])
    assert not p.ok and p.reason is not None and "1 GPU" in p.reason
    p = plan("m", "auto", 0, [], laptop, [])
    assert p.ok and p.gpus == ()
    # a list is trusted when nvidia-smi sees nothing (e.g. it is not installed here)
    p = plan("m", "auto", [0, 1], [], laptop, [])
    assert p.ok and p.gpus == (0, 1)
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert any("no GPUs were found" in n and "trusting" in n for n in p.notes)
    # ...but still exclusive against other engines' GPUs
    p = plan("m", "auto", [1], [], laptop, [H("other", (), (1,), in_flight=1)])
    assert not p.ok and p.blocked_by == ("other",)
    assert "GPU 1 held by other (1 in flight)" in (p.reason or "")


def test_gpu_error_is_quoted(tmp_path: Path) -> None:
    topo = read_topology(build_laptop(tmp_path), run=FakeRun(exc=FileNotFoundError()))
    p = plan("m", "auto", 2, [], topo, [])
    assert not p.ok and "nvidia-smi not found" in (p.reason or "")


# ---------------------------------------------------------------- 2-socket Xeon, 2 GPUs


def test_xeon_two_engines_one_socket_each_third_blocked(xeon: Topology) -> None:
    a = plan("a", "auto", "auto", [], xeon, [])
    assert a.ok
    assert a.numa_nodes == (1,)  # node 1 has more free memory
    assert a.cpus == (*range(8, 16), *range(24, 32))
    assert a.gpus == (0,)
    assert flags_of(a) == {
        "--kt-numa-nodes": (("1",), "derived"),
        "--kt-threadpool-count": (("1",), "derived"),
        "--kt-cpuinfer": (("8",), "derived"),
    }
    assert dict(a.env) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}

    ha = H("a", a.numa_nodes, a.gpus, in_flight=1, last_used=10)
    b = plan("b", "auto", "auto", [], xeon, [ha])
    assert b.ok and b.evict == ()
    assert b.numa_nodes == (0,)
    assert b.cpus == (*range(0, 8), *range(16, 24))
    assert b.gpus == (1,)
    assert b.env["CUDA_VISIBLE_DEVICES"] == "1"

    hb = H("b", b.numa_nodes, b.gpus, in_flight=3, last_used=5)
    c = plan("c", "auto", "auto", [], xeon, [ha, hb])
    assert not c.ok
    assert set(c.blocked_by) == {"a", "b"}
    assert c.reason is not None and c.reason.startswith("busy: ")
    assert "NUMA node 0 held by b (3 in flight)" in c.reason
    assert "NUMA node 1 held by a (1 in flight)" in c.reason
    assert c.evict == ()


def test_xeon_third_engine_evicts_lru_idle(xeon: Topology) -> None:
    ha = H("a", (1,), (0,), last_used=100)
    hb = H("b", (0,), (1,), last_used=50)
    c = plan("c", "auto", "auto", [], xeon, [ha, hb])
    assert c.ok
    assert c.evict == ("b",)  # least recently used
    assert c.numa_nodes == (0,) and c.gpus == (1,)
    assert c.blocked_by == ()


def test_a_victim_that_sleeps_is_said_to_be_put_to_sleep(xeon: Topology) -> None:
    """Issue 43: the plan said "evicts b" of an engine a swap puts to sleep."""
    ha = H("a", (1,), (0,), last_used=100)
    hb = H("b", (0,), (1,), last_used=50, sleeps=True)
    c = plan("c", "auto", "auto", [], xeon, [ha, hb])
    assert c.evict == ("b",) and c.sleeps == ("b",)
    assert "puts b to sleep (idle, least recently used) to free its resources" in c.notes
    assert not any(n.startswith("evicts b") for n in c.notes)
    assert c.to_dict()["sleeps"] == ["b"]
    stop = plan("c", "auto", "auto", [], xeon, [ha, H("b", (0,), (1,), last_used=50)])
    assert stop.sleeps == () and "evicts b (idle, least recently used)" in " ".join(stop.notes)


@pytest.mark.parametrize(
    ("b_kwargs", "why"),
    [
        ({"in_flight": 1}, "has requests in flight"),
        ({"pinned": True}, "pinned"),
        ({"state": "starting"}, "not ready"),
        ({"state": "draining"}, "not ready"),
    ],
)
def test_xeon_never_evicts_busy_pinned_or_unready(
    xeon: Topology, b_kwargs: dict[str, object], why: str
) -> None:
    ha = H("a", (1,), (0,), last_used=100)
    hb = H("b", (0,), (1,), last_used=1, **b_kwargs)  # type: ignore[arg-type]
    c = plan("c", "auto", "auto", [], xeon, [ha, hb])
    assert c.ok, why
    assert c.evict == ("a",), why  # the more recently used but evictable one
    assert c.numa_nodes == (1,) and c.gpus == (0,)


def test_xeon_nothing_evictable(xeon: Topology) -> None:
    holdings = [
        H("a", (1,), (0,), pinned=True, last_used=1),
        H("b", (0,), (1,), state="starting", last_used=2),
    ]
    c = plan("c", "auto", "auto", [], xeon, holdings)
    assert not c.ok
    assert c.blocked_by == ("b", "a")  # in resource order: node 0, node 1
    assert c.reason == (
        "busy: NUMA node 0 held by b (starting); NUMA node 1 held by a (pinned); "
        "GPU 0 held by a (pinned); GPU 1 held by b (starting)"
    )


def test_xeon_allow_evict_false(xeon: Topology) -> None:
    holdings = [H("a", (1,), (0,)), H("b", (0,), (1,))]
    c = plan("c", "auto", "auto", [], xeon, holdings, allow_evict=False)
    assert not c.ok and set(c.blocked_by) == {"a", "b"}
    assert "eviction not allowed" in (c.reason or "")


def test_xeon_evicts_only_what_is_needed(xeon: Topology) -> None:
    # a is LRU but holds node 0; the request names node 1, held by b
    holdings = [H("a", (0,), (), last_used=1), H("b", (1,), (0,), last_used=2)]
    p = plan("c", [1], "auto", [], xeon, holdings)
    assert p.ok and p.evict == ("b",)
    assert p.numa_nodes == (1,)


def test_xeon_evicts_for_gpus_only(xeon: Topology) -> None:
    # node 1 is free, but both GPUs are taken: only the GPU holder is evicted,
    # although the node holder is less recently used
    holdings = [H("a", (0,), (), last_used=1), H("b", (), (0, 1), last_used=2)]
    p = plan("c", "auto", "auto", [], xeon, holdings)
    assert p.ok and p.evict == ("b",)
    assert p.numa_nodes == (1,) and p.gpus == (0,)


def test_xeon_evicts_several_in_lru_order(xeon: Topology) -> None:
    holdings = [H("a", (1,), (0,), last_used=9), H("b", (0,), (1,), last_used=3)]
    p = plan("c", "all", 2, [], xeon, holdings)
    assert p.ok
    assert p.evict == ("b", "a")
    assert p.numa_nodes == (0, 1) and p.gpus == (0, 1)
    assert flags_of(p)["--kt-threadpool-count"] == (("2",), "derived")
    assert flags_of(p)["--kt-cpuinfer"] == (("16",), "derived")


def test_xeon_partial_eviction_never_reported_when_blocked(xeon: Topology) -> None:
    holdings = [H("a", (1,), (0,)), H("b", (0,), (1,), in_flight=1)]
    p = plan("c", "all", "auto", [], xeon, holdings)
    assert not p.ok and p.evict == ()
    assert p.blocked_by == ("b",)  # a would be evicted; b is what blocks
    assert p.reason == "busy: NUMA node 0 held by b (1 in flight)"


def test_xeon_gpu_contention_blocks(xeon: Topology) -> None:
    holdings = [H("a", (0,), (0, 1), in_flight=1)]
    p = plan("c", "auto", "auto", [], xeon, holdings)
    assert not p.ok and p.blocked_by == ("a",)
    assert p.reason == "busy: GPU 0 held by a (1 in flight); GPU 1 held by a (1 in flight)"


def test_xeon_single_engine(xeon: Topology) -> None:
    p = plan("m", "auto", "auto", [], xeon, [], single_engine=True)
    assert p.ok and p.numa_nodes == (0, 1)
    assert p.cpus == tuple(range(32))
    assert p.argv_flags() == [
        "--kt-numa-nodes",
        "0",
        "1",
        "--kt-threadpool-count",
        "2",
        "--kt-cpuinfer",
        "16",
    ]
    # one engine per machine: even a holder sharing nothing must go
    p = plan("m", "auto", 0, [], xeon, [H("x", (), (1,))], single_engine=True)
    assert p.ok and p.evict == ("x",)
    p = plan("m", [0], 0, [], xeon, [H("x", (), (), in_flight=1)], single_engine=True)
    assert not p.ok and p.blocked_by == ("x",)
    assert "one engine per machine" in (p.reason or "")


def test_xeon_numa_requests(xeon: Topology) -> None:
    assert plan("m", "all", 0, [], xeon, []).numa_nodes == (0, 1)
    assert plan("m", [0], 0, [], xeon, []).numa_nodes == (0,)
    p = plan("m", [1, 0], 0, [], xeon, [])
    assert p.numa_nodes == (1, 0)  # user order kept: pool i runs on numa_nodes[i]
    assert flags_of(p)["--kt-numa-nodes"] == (("1", "0"), "derived")
    p = plan("m", [5], 0, [], xeon, [])
    assert not p.ok and p.blocked_by == ()
    assert p.reason == "numa: unknown NUMA node 5 (machine has nodes 0,1)"
    p = plan("m", [], 0, [], xeon, [])
    assert not p.ok and "no NUMA node" in (p.reason or "")


def test_xeon_explicit_node_busy_even_if_other_free(xeon: Topology) -> None:
    p = plan("m", [1], 0, [], xeon, [H("qwen3-kt", (1,), (), in_flight=2)])
    assert not p.ok
    assert p.reason == "busy: NUMA node 1 held by qwen3-kt (2 in flight)"
    assert p.blocked_by == ("qwen3-kt",)


def test_xeon_gpu_requests(xeon: Topology) -> None:
    assert plan("m", "auto", 2, [], xeon, []).gpus == (0, 1)
    assert plan("m", "auto", [1], [], xeon, []).gpus == (1,)
    assert plan("m", "auto", "auto", [], xeon, [], tp_size=2).gpus == (0, 1)
    assert plan("m", "auto", "auto", ["--tp-size", "2"], xeon, []).gpus == (0, 1)
    assert plan("m", "auto", "auto", ["--tp", "2"], xeon, []).gpus == (0, 1)
    p = plan("m", "auto", 3, [], xeon, [])
    assert not p.ok and p.reason == "gpus: asks for 3 GPUs, machine has 2"
    p = plan("m", "auto", [4], [], xeon, [])
    assert not p.ok and p.reason == "gpus: unknown GPU 4 (machine has GPUs 0,1)"
    p = plan("m", "auto", "auto", [], xeon, [], tp_size=4)
    assert not p.ok and "tp_size=4" in (p.reason or "")
    p = plan("m", "auto", [0], [], xeon, [], tp_size=2)
    assert p.ok and any("tp_size=2" in n for n in p.notes)
    p = plan("m", "auto", 0, [], xeon, [])
    assert p.ok and p.gpus == () and dict(p.env) == {}


def test_xeon_auto_gpu_prefers_free_memory(tmp_path: Path) -> None:
    gpus = [(0, "H100", 81559, 70000), (1, "H100", 81559, 10), (2, "H100", 81559, 10)]
    topo = read_topology(build(tmp_path, xeon_machine()), run=FakeRun(smi_csv(gpus)))
    assert plan("m", "auto", "auto", [], topo, []).gpus == (1,)
    assert plan("m", "auto", 2, [], topo, []).gpus == (1, 2)


# ---------------------------------------------------------------- user flags win


def test_user_cpuinfer_kept(xeon: Topology) -> None:
    extra = ["--kt-cpuinfer", "12", "--kt-num-gpu-experts", "0"]
    p = plan("m", "auto", "auto", extra, xeon, [])
    assert p.ok
    assert p.flag("--kt-cpuinfer") == KtFlag("--kt-cpuinfer", ("12",), "user")
    assert p.argv_flags() == ["--kt-numa-nodes", "1", "--kt-threadpool-count", "1"]
    assert "--kt-cpuinfer" not in p.argv_flags()
    assert p.notes == (
        "--kt-cpuinfer 12 exceeds the 8 physical cores of NUMA nodes 1: "
        "expert threads will share cores",
    )
    p = plan("m", "all", "auto", extra, xeon, [])
    assert p.flag("--kt-cpuinfer") == KtFlag("--kt-cpuinfer", ("12",), "user")
    assert p.argv_flags() == ["--kt-numa-nodes", "0", "1", "--kt-threadpool-count", "2"]
    assert not p.notes


def test_user_cpuinfer_equals_form(xeon: Topology) -> None:
    p = plan("m", "auto", "auto", ["--kt-cpuinfer=12"], xeon, [])
    assert p.flag("--kt-cpuinfer") == KtFlag("--kt-cpuinfer", ("12",), "user")
    assert "--kt-cpuinfer" not in p.argv_flags()


def test_user_cpuinfer_too_big_noted(xeon: Topology) -> None:
    p = plan("m", "auto", "auto", ["--kt-cpuinfer", "64"], xeon, [])
    assert p.ok and any("exceeds the 8 physical cores" in n for n in p.notes)


def test_user_numa_nodes_decide_placement(xeon: Topology) -> None:
    p = plan("m", "auto", 0, ["--kt-numa-nodes", "0", "1"], xeon, [])
    assert p.ok and p.numa_nodes == (0, 1)
    assert p.flag("--kt-numa-nodes") == KtFlag("--kt-numa-nodes", ("0", "1"), "user")
    assert p.argv_flags() == ["--kt-threadpool-count", "2", "--kt-cpuinfer", "16"]
    assert not p.notes
    # ...so they are owned exclusively, like any planned node
    p = plan("m", "auto", 0, ["--kt-numa-nodes", "0"], xeon, [H("x", (0,), (), in_flight=1)])
    assert not p.ok and p.blocked_by == ("x",)
    # a config numa that disagrees gets a note; the user's flag is what kt-kernel uses
    p = plan("m", [1], 0, ["--kt-numa-nodes", "0"], xeon, [])
    assert p.ok and p.numa_nodes == (0,)
    assert any("differs" in n for n in p.notes)
    p = plan("m", "auto", 0, ["--kt-numa-nodes", "7"], xeon, [])
    assert not p.ok and "unknown NUMA node 7" in (p.reason or "")
    p = plan("m", "auto", 0, ["--kt-numa-nodes", "zero"], xeon, [])
    assert not p.ok and "not node ids" in (p.reason or "")


def test_user_pool_count_mismatch_noted(xeon: Topology) -> None:
    p = plan("m", [0], 0, ["--kt-threadpool-count", "2"], xeon, [])
    assert p.ok
    assert p.flag("--kt-threadpool-count") == KtFlag("--kt-threadpool-count", ("2",), "user")
    assert p.argv_flags() == ["--kt-numa-nodes", "0", "--kt-cpuinfer", "8"]
    assert any("kt-kernel requires them to be equal" in n for n in p.notes)
    p = plan("m", "auto", 0, ["--kt-numa-nodes=0", "--kt-threadpool-count", "2"], xeon, [])
    assert any("kt-kernel requires them to be equal" in n for n in p.notes)
    assert p.argv_flags() == ["--kt-cpuinfer", "8"]


def test_user_pool_count_sizes_auto(xeon: Topology) -> None:
    # weights converted for 2 pools: numa=auto takes 2 nodes, no mismatch
    p = plan("m", "auto", 0, ["--kt-threadpool-count", "2"], xeon, [])
    assert p.ok and p.numa_nodes == (0, 1) and not p.notes
    p = plan("m", "auto", 0, ["--kt-threadpool-count", "3"], xeon, [])
    assert not p.ok and "needs 3 NUMA nodes" in (p.reason or "")


def test_all_user_flags(xeon: Topology) -> None:
    extra = ["--kt-numa-nodes", "1", "--kt-threadpool-count", "1", "--kt-cpuinfer", "6"]
    p = plan("m", "auto", "auto", extra, xeon, [])
    assert p.ok and p.argv_flags() == []
    assert [f.origin for f in p.flags] == ["user", "user", "user"]


# ---------------------------------------------------------------- 4-node EPYC


def test_epyc_auto_fills_nodes_by_free_memory(epyc: Topology) -> None:
    holdings: list[Holding] = []
    order = []
    for i in range(4):
        p = plan(f"m{i}", "auto", "auto", [], epyc, holdings)
        assert p.ok and p.evict == ()
        assert len(p.numa_nodes) == 1 and len(p.gpus) == 1
        assert flags_of(p)["--kt-cpuinfer"] == (("8",), "derived")
        assert len(p.cpus) == 16
        order.append(p.numa_nodes[0])
        holdings.append(H(f"m{i}", p.numa_nodes, p.gpus, in_flight=1))
    assert order == [2, 1, 3, 0]  # 180G, then the 150G tie broken by lowest id, then 100G
    assert sorted(h.gpus[0] for h in holdings) == [0, 1, 2, 3]
    p = plan("m4", "auto", "auto", [], epyc, holdings)
    assert not p.ok and set(p.blocked_by) == {"m0", "m1", "m2", "m3"}


def test_epyc_all(epyc: Topology) -> None:
    p = plan("big", "all", 2, [], epyc, [])
    assert p.ok and p.numa_nodes == (0, 1, 2, 3)
    assert len(p.cpus) == 64
    assert flags_of(p)["--kt-threadpool-count"] == (("4",), "derived")
    assert flags_of(p)["--kt-cpuinfer"] == (("32",), "derived")
    assert p.gpus == (0, 1) and p.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_epyc_reserved_core(epyc: Topology) -> None:
    p = plan("m", [0], 0, [], epyc, [], reserved_cpus=[0, 32])
    assert p.cpus == (*range(1, 8), *range(33, 40))
    assert flags_of(p)["--kt-cpuinfer"] == (("7",), "derived")
    p = plan("m", [1], 0, [], epyc, [], reserved_cpus=[0, 32])  # not on node 1
    assert flags_of(p)["--kt-cpuinfer"] == (("8",), "derived")


def test_memory_only_node(tmp_path: Path) -> None:
    m = xeon_machine()
    m.nodes[2] = []
    m.mem_total_kb[2] = m.mem_free_kb[2] = 512 * 1024 * 1024  # most free memory of all
    topo = read_topology(build(tmp_path, m), nvidia_smi=None)
    p = plan("m", "auto", "auto", [], topo, [])
    assert p.ok and p.numa_nodes == (1,)  # never the CPU-less node
    p = plan("m", "all", "auto", [], topo, [])
    assert p.ok and p.numa_nodes == (0, 1)
    assert any("no CPUs" in n for n in p.notes)
    p = plan("m", [2], "auto", [], topo, [])
    assert not p.ok and "no online CPUs" in (p.reason or "")


# ---------------------------------------------------------------- holdings edge cases


def test_own_and_stopped_holdings_are_ignored(laptop: Topology) -> None:
    p = plan("m", "auto", "auto", [], laptop, [H("m", (0,), in_flight=5)])
    assert p.ok and p.evict == ()
    p = plan("m", "auto", "auto", [], laptop, [H("x", (0,), in_flight=5, state="stopped")])
    assert p.ok and p.evict == ()


def test_to_dict_is_json(xeon: Topology) -> None:
    p = plan("a", "auto", "auto", ["--kt-cpuinfer", "4"], xeon, [H("b", (0,), (1,))])
    d = json.loads(json.dumps(p.to_dict()))
    assert d["alias"] == "a" and d["ok"] is True
    assert d["numa_nodes"] == [1] and d["gpus"] == [0]
    assert d["cpulist"] == "8-15,24-31"
    assert d["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert d["flags"][2] == {"name": "--kt-cpuinfer", "values": ["4"], "origin": "user"}
    assert d["argv_flags"] == ["--kt-numa-nodes", "1", "--kt-threadpool-count", "1"]
    assert d["evict"] == [] and d["blocked_by"] == [] and d["reason"] is None
    bad = plan("a", [9], 0, [], xeon, []).to_dict()
    assert bad["ok"] is False and "unknown NUMA node 9" in bad["reason"]
    json.dumps(bad)


def test_plan_is_pure(xeon: Topology) -> None:
    holdings = [H("a", (1,), (0,), last_used=3), H("b", (0,), (1,), last_used=1)]
    assert plan("c", "auto", "auto", [], xeon, holdings) == plan(
        "c", "auto", "auto", [], xeon, list(holdings)
    )


# ---------------------------------------------------------------- properties


def _topo(n_nodes: int, n_gpus: int, mem: list[int]) -> Topology:
    nodes = tuple(NumaNode(i, (2 * i, 2 * i + 1), 100, mem[i % len(mem)]) for i in range(n_nodes))
    core_of = {c: (0, c // 2) for n in nodes for c in n.cpus}
    gpus = tuple(Gpu(i, "G", 1000, 0) for i in range(n_gpus))
    return Topology(nodes, "cpu", frozenset({"avx2"}), core_of, gpus, None)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, list[Holding], dict[str, object]]:
    n_nodes = draw(st.integers(1, 4))
    n_gpus = draw(st.integers(0, 4))
    topo = _topo(n_nodes, n_gpus, draw(st.lists(st.integers(0, 100), min_size=1, max_size=4)))
    holdings = []
    for i in range(draw(st.integers(0, 5))):
        holdings.append(
            Holding(
                alias=f"h{i}",
                numa_nodes=tuple(
                    draw(st.lists(st.integers(0, n_nodes - 1), unique=True, max_size=2))
                ),
                gpus=tuple(draw(st.lists(st.integers(0, 3), unique=True, max_size=2))),
                in_flight=draw(st.sampled_from([0, 0, 1])),
                pinned=draw(st.booleans()),
                last_used=draw(st.floats(0, 100)),
                state=draw(st.sampled_from(["ready", "ready", "starting", "stopped"])),
            )
        )
    numa = draw(
        st.one_of(
            st.just("auto"),
            st.just("all"),
            st.lists(st.integers(0, n_nodes), unique=True, min_size=1, max_size=3),
        )
    )
    gpus = draw(
        st.one_of(
            st.just("auto"),
            st.integers(0, 3),
            st.lists(st.integers(0, 4), unique=True, max_size=3),
        )
    )
    kwargs: dict[str, object] = {
        "numa": numa,
        "gpus": gpus,
        "single_engine": draw(st.booleans()),
        "allow_evict": draw(st.booleans()),
        "tp_size": draw(st.sampled_from([None, 1, 2])),
    }
    return topo, holdings, kwargs


@budget(400, deadline=None)
@given(scenarios())
def test_plans_never_overlap_holdings(
    scenario: tuple[Topology, list[Holding], dict[str, object]],
) -> None:
    topo, holdings, kw = scenario
    p = plan(
        "new",
        kw["numa"],  # type: ignore[arg-type]
        kw["gpus"],  # type: ignore[arg-type]
        [],
        topo,
        holdings,
        tp_size=kw["tp_size"],  # type: ignore[arg-type]
        single_engine=kw["single_engine"],  # type: ignore[arg-type]
        allow_evict=kw["allow_evict"],  # type: ignore[arg-type]
    )
    by_alias = {h.alias: h for h in holdings}
    live = [h for h in holdings if h.state != "stopped"]
    if not p.ok:
        assert p.reason
        assert p.evict == () and p.argv_flags() == [] and p.cpus == ()
        assert set(p.blocked_by) <= {h.alias for h in live}
        for alias in p.blocked_by:  # blockers are never idle evictable ones (when allowed)
            assert not (kw["allow_evict"] and by_alias[alias].evictable)
        return
    assert p.blocked_by == () and p.reason is None
    evicted = set(p.evict)
    staying = [h for h in live if h.alias not in evicted]
    for h in staying:
        assert not set(h.numa_nodes) & set(p.numa_nodes), (h, p)
        assert not set(h.gpus) & set(p.gpus), (h, p)
    if kw["single_engine"]:
        assert staying == []
    # eviction only of idle, unpinned, ready engines, in LRU order, only when allowed
    assert evicted <= {h.alias for h in live if h.evictable}
    if not kw["allow_evict"]:
        assert p.evict == ()
    times = [by_alias[a].last_used for a in p.evict]
    assert times == sorted(times)
    # minimal: keeping any one of the evicted engines makes the plan impossible
    for keep in p.evict:
        rest = [h for h in holdings if h.alias == keep or h.alias not in evicted]
        q = plan(
            "new",
            kw["numa"],  # type: ignore[arg-type]
            kw["gpus"],  # type: ignore[arg-type]
            [],
            topo,
            rest,
            tp_size=kw["tp_size"],  # type: ignore[arg-type]
            single_engine=kw["single_engine"],  # type: ignore[arg-type]
            allow_evict=False,
        )
        assert not q.ok, (keep, p)
    # the plan is internally consistent
    assert set(p.cpus) == set(topo.node_cpus(p.numa_nodes))
    assert p.flag("--kt-threadpool-count") == KtFlag(
        "--kt-threadpool-count", (str(len(p.numa_nodes)),), "derived"
    )
    if p.gpus:
        assert p.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, p.gpus))
    else:
        assert "CUDA_VISIBLE_DEVICES" not in p.env


@budget(200, deadline=None)
@given(scenarios())
def test_sequential_auto_plans_stay_disjoint(
    scenario: tuple[Topology, list[Holding], dict[str, object]],
) -> None:
    """Granting plans one after another (all busy) never hands a node or GPU out twice."""
    topo, _, _ = scenario
    holdings: list[Holding] = []
    for i in range(6):
        p = plan(f"e{i}", "auto", "auto", [], topo, holdings)
        if p.ok:
            assert p.evict == ()
            holdings.append(Holding(f"e{i}", p.numa_nodes, p.gpus, in_flight=1))
    nodes = [n for h in holdings for n in h.numa_nodes]
    gpus = [g for h in holdings for g in h.gpus]
    assert len(nodes) == len(set(nodes))
    assert len(gpus) == len(set(gpus))


def test_numa_none_owns_no_node_but_still_plans_gpus(xeon: Topology) -> None:
    holder = H("a", (0, 1), (0,))
    p = plan("b", "none", 1, ["--kt-cpuinfer", "4"], xeon, [holder])
    assert p.ok and p.numa_nodes == () and p.cpus == ()
    assert p.argv_flags() == ["--kt-threadpool-count", "2"] and p.gpus == (1,)
    assert flags_of(p) == {
        "--kt-cpuinfer": (("4",), "user"),
        "--kt-threadpool-count": (("2",), "derived"),
    }
    assert any("numa: none" in n for n in p.notes)
    busy = plan("c", "none", [0], [], xeon, [holder], allow_evict=False)
    assert not busy.ok and busy.blocked_by == ("a",)


def test_numa_none_still_gives_kt_its_thread_counts(xeon: Topology) -> None:
    """Without --kt-cpuinfer/--kt-threadpool-count kt-kernel fails building its first MoE
    layer (``cpuinfer_threads // threadpool_count`` with None), so "none" derives both from
    every usable CPU: one pool per node, one expert thread per physical core."""
    p = plan("b", "none", "auto", [], xeon, [])
    cores = len(xeon.physical_cores(xeon.node_cpus(tuple(n.id for n in xeon.nodes if n.cpus))))
    assert flags_of(p) == {
        "--kt-threadpool-count": (("2",), "derived"),
        "--kt-cpuinfer": ((str(cores),), "derived"),
    }
    assert "--kt-numa-nodes" not in p.argv_flags()
