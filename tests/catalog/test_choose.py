"""Variant choice on the two described machines, read from fixture sysfs/procfs trees and
a fake nvidia-smi: the variant that fits, and why each other one does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktd.catalog.choose import choose
from ktd.catalog.load import load
from ktd.core.topology import Topology
from ktd.topology import read_topology
from tests.catalog.machines import amx_box, avx2_box
from tests.fixtures.topology import build, laptop_machine, smi_script

CAT = load()


def pick(name: str, topo: Topology) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    entry = CAT.find(name)
    assert entry is not None
    c = choose(entry, topo)
    return (c.chosen.variant.name if c.chosen else None), {
        v.variant.name: v.reasons for v in c.verdicts
    }


@pytest.fixture
def amx(tmp_path: Path) -> Topology:
    return amx_box(tmp_path / "amx")


@pytest.fixture
def avx2(tmp_path: Path) -> Topology:
    return avx2_box(tmp_path / "avx2")


def test_the_boxes_read_as_described(amx: Topology, avx2: Topology) -> None:
    assert amx.isa() == "amx" and len(amx.nodes) == 2 and amx.gpus[0].name == "NVIDIA L20"
    assert avx2.isa() == "avx2" and len(avx2.nodes) == 1 and avx2.gpus[0].memory_total_mib == 24564


def test_amx_box_takes_the_amx_upload_of_kimi_k2_thinking(amx: Topology) -> None:
    chosen, _ = pick("kimi-k2-thinking", amx)
    assert chosen == "amxint4"
    c = choose(CAT.find("kimi-k2-thinking"), amx)  # type: ignore[arg-type]
    assert c.chosen is not None and "NUMA count" in c.chosen.unknown[0]  # read after the pull


def test_avx2_box_runs_no_kimi_k2_thinking_and_says_why_for_each(avx2: Topology) -> None:
    chosen, reasons = pick("kimi-k2-thinking", avx2)
    assert chosen is None
    assert "lacks amx_tile, amx_int8, amx_bf16" in reasons["amxint4"][0]
    assert "lacks avx512f, avx512bw" in reasons["rawint4"][0]
    assert reasons["rawint4-avx2"] == (
        "needs 650 GB of RAM; this box has 275 GB",
        "needs 48 GB of GPU memory; the GPUs have 26 GB in all",
    )


def test_an_amx_box_prefers_native_fp8_to_a_conversion_ktd_does_not_run(amx: Topology) -> None:
    chosen, reasons = pick("deepseek-v3.2", amx)
    assert chosen == "fp8"
    assert reasons["amxint4"] == (
        "its CPU weights need a conversion ktd does not run (AMXINT4: see the variant's convert)",
    )
    entry = CAT.find("deepseek-v3.2")
    assert entry is not None
    assert choose(entry, amx, converted=["amxint4"]).chosen.variant.name == "amxint4"  # type: ignore[union-attr]


def test_avx2_box_falls_back_to_the_avx2_backend(avx2: Topology) -> None:
    chosen, reasons = pick("qwen3-30b-a3b", avx2)
    assert chosen == "bf16-avx2"
    assert "lacks avx512f, avx512bw, avx512_bf16" in reasons["bf16"][0]
    assert pick("deepseek-v4-flash", avx2)[0] == "mxfp4"  # AVX2 and FMA are enough


def test_an_upload_converted_for_more_numa_pools_than_the_box_has(
    avx2: Topology, amx: Topology
) -> None:
    entry = CAT.find("kimi-k2-thinking")
    assert entry is not None
    three = choose(entry, amx, numa_counts={"amxint4": 3}).verdicts[0]
    assert three.reasons == (
        "the weights were converted for 3 NUMA pools; this box has 2 NUMA nodes",
    )
    assert choose(entry, amx, numa_counts={"amxint4": 2}).chosen.variant.name == "amxint4"  # type: ignore[union-attr]


def test_no_gpu_no_variant(tmp_path: Path) -> None:
    fs = build(tmp_path / "fs", laptop_machine())
    topo = read_topology(fs, nvidia_smi=[str(tmp_path / "absent-nvidia-smi")])
    chosen, reasons = pick("deepseek-v4-flash", topo)
    assert chosen is None
    assert "no GPU found" in reasons["mxfp4"][0] and "not found" in reasons["mxfp4"][0]


def test_the_tiny_test_model_needs_no_gpu_nor_cpu_feature(tmp_path: Path) -> None:
    tiny = load([Path(__file__).with_name("tiny.json")]).find("tiny-qwen2")
    assert tiny is not None
    fs = build(tmp_path / "fs", laptop_machine())
    topo = read_topology(fs, nvidia_smi=[str(smi_script(tmp_path / "smi", []))])
    assert choose(tiny, topo).chosen is not None
