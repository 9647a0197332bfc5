"""Memory estimate and fit (pure), on fixture topologies with sparse weight files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec

from ktd.core import fit
from ktd.core.config import ModelSpec
from ktd.daemon.engine import weights
from ktd.topology import read_topology
from tests.daemon.engine.test_preflight import GIB, safetensors, sparse
from tests.fixtures.topology import build_epyc, build_xeon

DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "vocab_size": 129280,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}


def spec(path: Path, kt: Path | None, ctx: int = 0) -> ModelSpec:
    return ModelSpec(
        alias="m", backend="kt", path=str(path), served=True, source="t",
        kt_weight_path=str(kt) if kt else None, ctx=ctx,
    )  # fmt: skip


def test_kv_cache_mla_and_gqa() -> None:
    # DeepSeek MLA: 61 layers x ctx x (512 + 64) x 2 bytes
    assert fit.kv_cache_bytes(DEEPSEEK_V3, 32768) == 61 * 32768 * 576 * 2
    gqa = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
           "hidden_size": 4096, "torch_dtype": "bfloat16"}  # fmt: skip
    assert fit.kv_cache_bytes(gqa, 8192) == 2 * 48 * 8192 * 4 * 128 * 2
    assert fit.kv_cache_bytes({}, 8192) is None


def test_dense_estimate_from_config_is_in_the_right_range() -> None:
    # DeepSeek-V3's non-expert weights are ~17 B params (~33 GB in bf16); ~27 GB VRAM known.
    dense = fit.dense_bytes_from_config(DEEPSEEK_V3)
    assert dense is not None and 15 * GIB < dense < 45 * GIB


def test_sparse_weights_on_the_xeon_split_per_node(tmp_path: Path) -> None:
    model = tmp_path / "ds"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    kt = tmp_path / "ds-kt"
    sparse(kt / "_layer_3" / "_numa_0" / "w.kt", 180 * GIB)
    sparse(kt / "_layer_3" / "_numa_1" / "w.kt", 180 * GIB)
    est = weights.estimate_spec(spec(model, kt, ctx=32768))
    assert est.host_bytes == 360 * GIB
    assert est.kv_bytes == 61 * 32768 * 576 * 2
    topo = read_topology(build_xeon(tmp_path / "xeon"), nvidia_smi=None)
    free = {n.id: n.available_kb * 1024 for n in topo.nodes}  # 200 and 240 GiB
    both = fit.check(est, node_free=free, numa_nodes=(0, 1), gpu_free=None, gpus=())
    assert not both.refuses and both.no_gpu  # 180 GiB per node; the fixture has no GPU
    one = fit.check(est, node_free=free, numa_nodes=(1,), gpu_free=None, gpus=())
    assert not one.ok
    assert "NUMA node 1 needs 360.0 GiB RAM, has 240.0 GiB free" in (one.reason or "")


def test_evictions_count_as_freed(tmp_path: Path) -> None:
    topo = read_topology(build_epyc(tmp_path / "epyc"), nvidia_smi=None)
    free = {n.id: n.available_kb * 1024 for n in topo.nodes}  # node 2: 180 GiB
    est = fit.Estimate(host_bytes=250 * GIB, gpu_weights_bytes=None, kv_bytes=None)
    alone = fit.check(est, node_free=free, numa_nodes=(2,), gpu_free=None, gpus=())
    assert not alone.ok
    victim = fit.Estimate(host_bytes=100 * GIB, gpu_weights_bytes=None, kv_bytes=None)
    freed = fit.freed_by([fit.Resident(victim, (2,), ())])
    after = fit.check(
        est, node_free=free, numa_nodes=(2,), gpu_free=None, gpus=(), freed=freed,
        evicting=("old",),
    )  # fmt: skip
    assert after.ok


def test_gpu_memory_on_a_machine_without_a_gpu_does_not_fit() -> None:
    """Issue 43: ``--estimate`` said "fits" for 38.3 GiB of GPU memory on a box with no
    GPU. It does not fit; alone it refuses nothing (SGLang decides: ``--device cpu``)."""
    est = fit.Estimate(host_bytes=10 * GIB, gpu_weights_bytes=30 * GIB, kv_bytes=8 * GIB)
    none = fit.check(est, node_free={0: 64 * GIB}, numa_nodes=(), gpu_free=None, gpus=())
    assert not none.ok and none.no_gpu and not none.refuses
    assert none.reason == (
        "does not fit: no GPU: it needs 38.0 GiB of GPU memory (weights + KV cache) "
        "and ktd sees no GPU on this machine"
    )
    assert {"what": "GPU memory", "need": 38 * GIB, "free": 0} in none.rows
    assert none.to_dict()["no_gpu"] is True and none.to_dict()["refuses"] is False
    # Short of host RAM too: refused, and both said.
    both = fit.check(est, node_free={0: 4 * GIB}, numa_nodes=(), gpu_free=None, gpus=())
    assert both.refuses and both.no_gpu
    assert "host needs 10.0 GiB RAM" in (both.reason or "") and "no GPU" in (both.reason or "")
    # No GPU memory needed (no estimate of it): nothing to say.
    cpu = fit.Estimate(host_bytes=10 * GIB, gpu_weights_bytes=None, kv_bytes=None)
    fine = fit.check(cpu, node_free={0: 64 * GIB}, numa_nodes=(), gpu_free=None, gpus=())
    assert fine.ok and not fine.no_gpu


def test_gpu_split_over_tp_and_unknown_gpus_not_checked(tmp_path: Path) -> None:
    est = fit.Estimate(host_bytes=None, gpu_weights_bytes=100 * GIB, kv_bytes=20 * GIB)
    gfree = {0: 70 * GIB, 1: 70 * GIB}
    assert fit.check(est, node_free={}, numa_nodes=(), gpu_free=gfree, gpus=(0, 1)).ok
    one = fit.check(est, node_free={}, numa_nodes=(), gpu_free=gfree, gpus=(0,))
    assert not one.ok and "GPU 0 needs 120.0 GiB, has 70.0 GiB free" in (one.reason or "")
    unknown = fit.check(est, node_free={}, numa_nodes=(), gpu_free=None, gpus=(0,))
    assert unknown.ok and unknown.notes


def test_safetensors_headers_separate_experts(tmp_path: Path) -> None:
    safetensors(
        tmp_path / "a.safetensors",
        {
            "model.layers.3.mlp.experts.7.down_proj.weight": 10 * GIB,
            "model.layers.3.mlp.shared_experts.down_proj.weight": 1 * GIB,
            "lm_head.weight": 2 * GIB,
        },
    )
    assert weights.non_expert_bytes(str(tmp_path)) == 3 * GIB
    assert weights.non_expert_bytes(str(tmp_path / "none")) is None


def test_page_cache_counts_as_available(tmp_path: Path) -> None:
    root = build_xeon(tmp_path / "x")
    meminfo = root / "sys/devices/system/node/node0/meminfo"
    meminfo.write_text(
        "Node 0 MemTotal: 268435456 kB\nNode 0 MemFree: 1048576 kB\n"
        "Node 0 FilePages: 209715200 kB\nNode 0 Shmem: 1048576 kB\n"
        "Node 0 SReclaimable: 1048576 kB\n"
    )
    node0 = read_topology(root, nvidia_smi=None).node(0)
    assert node0.mem_free_kb == 1048576
    assert node0.available_kb == 1048576 + 209715200 - 1048576 + 1048576


def test_estimate_without_weights_or_config(tmp_path: Path) -> None:
    est = weights.estimate_spec(spec(tmp_path / "missing", None))
    assert est.host_bytes is None and est.gpu_bytes is None and len(est.notes) == 2
    assert fit.check(est, node_free={0: 0}, numa_nodes=(0,), gpu_free={0: 0}, gpus=(0,)).ok
    assert dataclasses.asdict(est)  # plain data


def test_a_victim_that_sleeps_frees_its_gpu_and_takes_host_ram_for_its_weights_copy() -> None:
    est = fit.Estimate(host_bytes=100, gpu_weights_bytes=10, kv_bytes=30)
    stopped = fit.freed_by([fit.Resident(est, (0, 1), (0,))])
    assert stopped.host_by_node == {0: 50, 1: 50} and stopped.gpu_by_index == {0: 40}
    asleep = fit.freed_by([], [fit.Resident(est, (0, 1), (0,), residue={0: 5})])
    assert asleep.host_by_node == {0: -5, 1: -5} and asleep.gpu_by_index == {0: 35}
    assert fit.host_held(est, backed_up=True) == 110 and fit.host_held(est, backed_up=False) == 100
    assert fit.host_held(fit.Estimate(None, None, None), backed_up=True) is None


def test_an_engine_that_slept_once_holds_its_host_copy_awake_and_frees_it_stopped() -> None:
    """Issue 40: torch_memory_saver (0.0.9, the kt fork's) keeps the pinned host copy
    of the GPU weights after a resume. A victim that has slept frees it when stopped and
    takes no more host memory when put to sleep again; an asleep engine keeps its
    residue on the GPU (measured, else ``RESIDUE_GUESS``)."""
    est = fit.Estimate(host_bytes=100 * GIB, gpu_weights_bytes=20 * GIB, kv_bytes=10 * GIB)
    slept = fit.Resident(est, (0,), (0,), backed_up=True)
    assert fit.freed_by([slept]).host_by_node == {0: 120 * GIB}
    again = fit.freed_by([], [slept])
    assert again.host_by_node == {} and again.gpu_by_index == {0: 30 * GIB - fit.RESIDUE_GUESS}


def test_a_wake_asks_only_the_gpu_memory_its_residue_does_not_cover() -> None:
    est = fit.Estimate(host_bytes=100 * GIB, gpu_weights_bytes=20 * GIB, kv_bytes=20 * GIB)
    waker = fit.Resident(est, (0,), (0, 1), backed_up=True, residue={0: 2 * GIB, 1: 3 * GIB})
    need = fit.to_wake(waker)
    assert need.host_bytes is None and need.gpu_bytes == 35 * GIB
    short = fit.check(
        need, node_free={0: 0}, numa_nodes=(0,), gpu_free={0: 10 * GIB, 1: 10 * GIB}, gpus=(0, 1)
    )
    assert not short.ok and "GPU 0" in (short.reason or "")


def test_gpu_weights_count_replicas_per_rank_and_the_gpu_experts() -> None:
    """The estimate left out the experts kept on the GPU (``--kt-num-gpu-experts``) and the
    weights every tensor-parallel rank keeps whole (issue 40)."""
    assert fit.gpu_weights(100, replicated=10, tp=4) == 130
    # 8 of 64 routed experts per layer on the GPU: an eighth of the routed experts' bytes
    assert fit.gpu_weights(100, routed_expert_bytes=640, gpu_experts=8, routed_experts=64) == 180
    assert fit.gpu_weights(100, routed_expert_bytes=640, gpu_experts=99, routed_experts=64) == 740


def test_the_estimate_reads_replicated_tensors_and_gpu_experts_from_the_headers(
    tmp_path: Path,
) -> None:
    model = tmp_path / "m"
    safetensors(
        model / "a.safetensors",
        {
            "model.layers.1.mlp.experts.7.down_proj.weight": 64 * GIB,
            "model.layers.1.mlp.gate.weight": 1 * GIB,
            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight": 1 * GIB,
            "lm_head.weight": 6 * GIB,
            "model.norm.weight": 2 * GIB,
        },
    )
    split = weights.weight_split(str(model))
    assert split is not None and split.experts == 64 * GIB and split.dense == 10 * GIB
    (model / "config.json").write_text(json.dumps({"n_routed_experts": 64, "hidden_size": 64}))
    extra = ("--tp", "2", "--kt-num-gpu-experts", "8")
    est = weights.estimate_spec(msgspec.structs.replace(spec(model, None), extra_args=extra))
    # lm_head sharded; router, kv_a and the norm whole on both ranks; 8/64 of the experts
    assert est.gpu_weights_bytes == 10 * GIB + 4 * GIB + 8 * GIB


def test_numa_maps_and_nvidia_smis_per_process_answers_read() -> None:
    from ktd.core.topology import parse_gpu_use, parse_numa_maps

    maps = (
        "7f0000000000 default anon=3 dirty=3 N0=2 N1=1 kernelpagesize_kB=4\n"
        "7f1000000000 bind:0 file=/x huge N0=1 kernelpagesize_kB=2048\n"
        "not a line of numa_maps\n"
    )
    assert parse_numa_maps(maps) == {0: 2 * 4096 + 2048 * 1024, 1: 4096}
    uuids = "0, GPU-aaa\n1, GPU-bbb\n"
    apps = "GPU-aaa, 10, 1024 MiB\nGPU-bbb, 11, 512 MiB\nGPU-aaa, 99, 7 MiB\n"
    assert parse_gpu_use(uuids, apps, [10, 11]) == {0: GIB, 1: GIB // 2}
    assert parse_gpu_use(uuids, "", [10]) == {}


def test_a_verdict_says_who_is_put_to_sleep_rather_than_evicted() -> None:
    """Issue 43: "does not fit after evicting a" of an engine a swap puts to sleep."""
    est = fit.Estimate(host_bytes=250 * GIB, gpu_weights_bytes=None, kv_bytes=None)
    short = fit.check(
        est, node_free={0: GIB}, numa_nodes=(0,), gpu_free=None, gpus=(),
        evicting=("a", "b"), sleeping=("a",),
    )  # fmt: skip
    assert (short.reason or "").startswith("does not fit after putting a to sleep and evicting b:")
    only = fit.check(
        est, node_free={0: GIB}, numa_nodes=(0,), gpu_free=None, gpus=(),
        evicting=("a",), sleeping=("a",),
    )  # fmt: skip
    assert (only.reason or "").startswith("does not fit after putting a to sleep:")
