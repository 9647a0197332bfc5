"""Flags worked out for the two described machines: origin of each, the user's winning,
the GPU experts' arithmetic, and AMX weights refused on a placement of another NUMA count."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ktd.catalog.flags import Sizes, derive, sglang_reserve_mib
from ktd.catalog.load import load
from ktd.catalog.schema import Entry
from ktd.core.topology import Topology
from tests.catalog.machines import AMX_GPUS, AVX2_GPUS, amx_box, avx2_box

CAT = load()
GB = 1e9
MIB = 1 << 20


def entry(name: str) -> Entry:
    e = CAT.find(name)
    assert e is not None
    return e


@pytest.fixture
def amx(tmp_path: Path) -> Topology:
    return amx_box(tmp_path / "amx")


@pytest.fixture
def avx2(tmp_path: Path) -> Topology:
    return avx2_box(tmp_path / "avx2")


def values(d: object, name: str) -> tuple[tuple[str, ...], str]:
    f = d.flag(name)  # type: ignore[attr-defined]
    assert f is not None, name
    return f.values, f.origin


@pytest.mark.parametrize(
    ("box", "gpus", "cores", "pools"), [("amx", AMX_GPUS, 16, 2), ("avx2", AVX2_GPUS, 32, 1)]
)
def test_deepseek_v4_flash_before_the_pull(
    box: str,
    gpus: list[tuple[int, str, int, int]],
    cores: int,
    pools: int,
    request: pytest.FixtureRequest,
) -> None:
    topo: Topology = request.getfixturevalue(box)
    e = entry("deepseek-v4-flash")
    d = derive(e, e.variants[0], topo)
    [(_, _, total, used)] = gpus
    # kt's registry formula (no config.json yet): (free - 16 GB) / 1.5 GB per expert.
    expect = math.floor(((total - used) * MIB - 16 * GB) / (1.5 * GB))
    assert values(d, "--kt-num-gpu-experts") == ((str(expect),), "derived")
    assert values(d, "--kt-method") == (("MXFP4",), "derived")
    assert values(d, "--kt-cpuinfer") == ((str(cores),), "derived")
    assert values(d, "--kt-threadpool-count") == ((str(pools),), "derived")
    assert values(d, "--attention-backend") == (("flashinfer",), "catalog")
    assert d.refusals == ()
    assert any("16 GB per GPU" in line for line in d.arithmetic)
    # Placement's flags are shown but never written to models.json (derived at each launch).
    args = d.extra_args()
    assert "--kt-cpuinfer" not in args and "--kt-method" in args and "--kt-num-gpu-experts" in args


def test_a_users_flag_always_wins(avx2: Topology) -> None:
    e = entry("deepseek-v4-flash")
    mine = ["--kt-num-gpu-experts", "4", "--attention-backend=triton", "--kt-method", "MXFP4"]
    d = derive(e, e.variants[0], avx2, extra_args=mine)
    assert values(d, "--kt-num-gpu-experts") == (("4",), "user")
    assert values(d, "--attention-backend") == (("triton",), "user")
    assert values(d, "--kt-method") == (("MXFP4",), "user")
    assert "--kt-num-gpu-experts" not in d.extra_args()  # the user's stay where they wrote them


def test_amx_weights_of_another_numa_count_are_refused(amx: Topology) -> None:
    e = entry("kimi-k2-thinking")
    amx_variant = e.variants[0]
    assert amx_variant.kt_method == "AMXINT4"
    ok = derive(e, amx_variant, amx, weights_numa=2)
    assert ok.refusals == () and values(ok, "--kt-threadpool-count") == (("2",), "derived")
    one_node = derive(e, amx_variant, amx, nodes=[0], weights_numa=2)
    [why] = one_node.refusals
    assert "converted for 2 NUMA pools but the placement gives 1" in why and "#2128" in why
    told = derive(e, amx_variant, amx, weights_numa=2, extra_args=["--kt-threadpool-count", "1"])
    assert told.refusals and values(told, "--kt-threadpool-count") == (("1",), "user")
    unread = derive(e, amx_variant, amx)
    assert unread.refusals == () and any("not read yet" in n for n in unread.notes)


#: A config.json shaped like a 30B-A3B-class Qwen3 MoE (a fixture, not the model's).
QWEN_LIKE = {
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "moe_intermediate_size": 768,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}


def test_gpu_experts_from_free_memory_attention_kv_cache_and_sglangs_reserve(
    avx2: Topology,
) -> None:
    e = entry("qwen3-30b-a3b")
    v = e.variant("bf16-avx2")
    assert v is not None
    sizes = Sizes(dense=3_000_000_000, replicated=0, experts=57_000_000_000)
    d = derive(e, v, avx2, model_config=QWEN_LIKE, sizes=sizes, ctx=32768)
    [(_, _, total, used)] = AVX2_GPUS
    free = (total - used) * MIB
    keep = total * MIB * (1 - 0.80)  # the catalog's --mem-fraction-static 0.80
    kv = 2 * 48 * 32768 * 4 * 128 * 2  # K and V, layers, tokens, KV heads, head dim, bf16
    per_expert = 57_000_000_000 / 128
    expect = math.floor((free - keep - 3_000_000_000 - kv) / per_expert)
    assert values(d, "--kt-num-gpu-experts") == ((str(expect),), "derived")
    text = "\n".join(d.arithmetic)
    assert "--mem-fraction-static 0.8" in text and "KV cache for 32,768 tokens" in text
    assert "non-expert weights (safetensors headers)" in text and f"= {expect} experts" in text
    assert values(d, "--kt-method") == (("BF16",), "derived")
    assert values(d, "--tool-call-parser") == (("qwen25",), "catalog")


def test_a_gpu_too_small_for_one_expert_gives_zero_and_a_floor_refuses(avx2: Topology) -> None:
    e = entry("qwen3-30b-a3b")
    v = e.variant("bf16-avx2")
    assert v is not None
    huge = Sizes(dense=30_000_000_000, replicated=0, experts=57_000_000_000)
    d = derive(e, v, avx2, model_config=QWEN_LIKE, sizes=huge, ctx=32768)
    assert values(d, "--kt-num-gpu-experts") == (("0",), "derived") and d.refusals == ()
    import msgspec

    floor = msgspec.structs.replace(
        e, defaults=msgspec.structs.replace(e.defaults, min_gpu_experts=1)
    )
    assert derive(floor, v, avx2, model_config=QWEN_LIKE, sizes=huge, ctx=32768).refusals


def test_sglangs_own_reserve_is_its_heuristic() -> None:
    # sglang-kt 0.7.2 ServerArgs._handle_gpu_memory_settings: a 24 GB card at TP 1.
    assert sglang_reserve_mib(24564, 1, None, None) == 512 + 2048 * 1.5 + 24 * 2 + 1 / 8 * 1024
    assert sglang_reserve_mib(81559, 1, None, None) == 512 + 8192 * 1.5 + 256 * 2 + 1 / 8 * 1024
    assert sglang_reserve_mib(81559, 1, 2048, 8) == 10 * 1024  # its floor above 60 GiB
    assert sglang_reserve_mib(49140, 2, 8192, 4) == 512 + 8192 * 1.5 + 4 * 2 + 2 / 8 * 1024
