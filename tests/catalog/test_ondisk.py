"""What is on disk under catalog.dir, the NUMA count AMX weights record, and the
models.json entry written from a pulled entry."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from ktd.catalog import layout, ondisk, verify
from ktd.catalog.flags import derive
from ktd.catalog.load import load
from ktd.catalog.modelsentry import EntryError, models_entry
from ktd.core.config import ModelEntry
from tests.catalog.machines import amx_box, avx2_box

CAT = load()
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def safetensors(path: Path, keys: list[str]) -> None:
    header = json.dumps(
        {k: {"dtype": "I8", "shape": [1], "data_offsets": [i, i + 1]} for i, k in enumerate(keys)}
    )
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * len(keys))


def amx_keys(pools: int) -> list[str]:
    return [
        f"blk.0.ffn_up_exps.{e}.numa.{n}.{w}"
        for e in range(2)
        for n in range(pools)
        for w in ("weight", "scale")
    ]


def finished(dest: Path, repo: str, commit: str, files: dict[str, bytes]) -> None:
    """A pull's directory as the pull jobs leave it: the files and the verified marker."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)
    checked = tuple(verify.Checked(name=n, size=len(d)) for n, d in files.items())
    verify.write_marker(
        dest, verify.Marker(repo=repo, revision=dest.name, commit=commit, files=checked)
    )


def test_layout_and_what_is_on_disk(tmp_path: Path) -> None:
    """The pull jobs' layout is the one read: a finished pull (``.ktd/verified.json``) is
    on disk with the commit its marker records; one under way is partial with its bytes,
    partial files included; a directory that is no pull is not listed."""
    base = tmp_path / "models"
    repo = "deepseek-ai/DeepSeek-V4-Flash"
    done = ondisk.revision_dir(base, repo, "main")
    assert done == layout.dest_for(base, repo, "main")
    assert done == base / "deepseek-ai--DeepSeek-V4-Flash" / "main"
    finished(done, repo, COMMIT_A, {"config.json": b"{}"})
    partial = ondisk.revision_dir(base, repo, COMMIT_B)
    partial.mkdir()
    (partial / "config.json").write_bytes(b"{}")
    part = layout.partial_path(partial, "e" * 64)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 10)
    (base / "deepseek-ai--DeepSeek-V4-Flash" / "not-a-pull").mkdir()
    got = ondisk.on_disk(base, repo)
    assert [(p.revision, p.commit, p.complete, p.bytes) for p in got] == [
        ("main", COMMIT_A, True, 2),
        (COMMIT_B, COMMIT_B, False, 12),
    ]
    assert ondisk.on_disk(base, "nobody/nothing") == []


def test_a_pull_whose_file_changed_since_it_was_checked_is_not_complete(
    tmp_path: Path,
) -> None:
    dest = ondisk.revision_dir(tmp_path, "a/b", "main")
    finished(dest, "a/b", COMMIT_A, {"model.safetensors": b"12345"})
    [ok] = ondisk.on_disk(tmp_path, "a/b")
    assert ok.complete and ok.problems == ()
    (dest / "model.safetensors").write_bytes(b"123")
    [bad] = ondisk.on_disk(tmp_path, "a/b")
    assert not bad.complete
    assert bad.problems == ("model.safetensors: 3 bytes, 5 when it was checked",)


@pytest.mark.parametrize("pools", [1, 2, 4])
def test_numa_count_from_merged_safetensors(tmp_path: Path, pools: int) -> None:
    safetensors(tmp_path / "model-00001-of-00001.safetensors", amx_keys(pools))
    assert ondisk.numa_count(tmp_path) == pools
    index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in amx_keys(pools + 1)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert ondisk.numa_count(tmp_path) == pools + 1  # the index, when there is one


def test_numa_count_from_unmerged_layer_folders(tmp_path: Path) -> None:
    for n in range(2):
        (tmp_path / "_layer_0" / f"_numa_{n}").mkdir(parents=True)
    assert ondisk.numa_count(tmp_path) == 2


def test_no_numa_count_in_native_weights(tmp_path: Path) -> None:
    safetensors(tmp_path / "model.safetensors", ["model.layers.0.mlp.experts.0.up_proj.weight"])
    assert ondisk.numa_count(tmp_path) is None
    assert ondisk.numa_count(tmp_path / "absent") is None


def test_models_entry_for_a_native_variant(tmp_path: Path) -> None:
    topo = avx2_box(tmp_path / "box")
    e = CAT.find("deepseek-v4-kt")
    assert e is not None
    d = derive(e, e.variants[0], topo, extra_args=["--kt-num-gpu-experts", "2"])
    out = models_entry(e, e.variants[0], {"model": "/m/v4"}, d, topo)
    entry = ModelEntry(**{k: v for k, v in out.items() if k != "kt"})  # the desk's type takes it
    assert entry.catalog == "deepseek-v4-flash"  # written from the catalog: its flags derived
    assert out["path"] == "/m/v4" and out["backend"] == "kt" and out["alias"] == "deepseek-v4-flash"
    assert out["kt"]["kt_weight_path"] == "/m/v4"  # native: the model's own files
    args = out["kt"]["extra_args"]
    assert args[args.index("--kt-method") + 1] == "MXFP4"
    assert "--kt-num-gpu-experts" not in args and "--kt-cpuinfer" not in args
    assert "numa" not in out


def test_models_entry_for_an_amx_upload_asks_for_its_numa_count(tmp_path: Path) -> None:
    topo = amx_box(tmp_path / "box")
    e = CAT.find("kimi-k2-thinking")
    assert e is not None
    v = e.variants[0]
    paths = {"model": "/m/k2", "kt-weights": "/m/k2-cpu"}
    two = models_entry(e, v, paths, derive(e, v, topo, weights_numa=2), topo, weights_numa=2)
    assert two["kt"]["kt_weight_path"] == "/m/k2-cpu" and two["numa"] == "all"
    one = models_entry(
        e, v, paths, derive(e, v, topo, nodes=[1], weights_numa=1), topo, weights_numa=1
    )
    assert one["numa"] == [1]  # the node with the most free memory
    with pytest.raises(EntryError, match="#2128"):
        models_entry(
            e, v, paths, derive(e, v, topo, nodes=[0], weights_numa=2), topo, weights_numa=2
        )
    with pytest.raises(EntryError, match="no CPU weights"):
        models_entry(e, v, {"model": "/m/k2"}, derive(e, v, topo), topo)


def test_the_sizes_walk_skips_what_vanishes(tmp_path: Path) -> None:
    d = ondisk.revision_dir(tmp_path, "a/b", COMMIT_A)
    layout.ktd_dir(d).mkdir(parents=True)
    os.symlink(tmp_path / "gone", d / "dangling")
    assert ondisk.on_disk(tmp_path, "a/b")[0].bytes == 0


def test_what_a_pull_fetches_for_each_variant(tmp_path: Path) -> None:
    from ktd.catalog.wanted import pull_specs

    e = CAT.find("kimi-k2-thinking")
    assert e is not None
    amx, native = e.variant("amxint4"), e.variant("rawint4")
    assert amx is not None and native is not None
    [model] = pull_specs(e, native, tmp_path)
    assert (model.role, model.repo, model.revision) == (
        "model",
        "moonshotai/Kimi-K2-Thinking",
        "main",
    )
    assert (
        model.dest == str(tmp_path / "moonshotai--Kimi-K2-Thinking" / "main")
        and "*.safetensors" in model.patterns
    )
    both = pull_specs(e, amx, tmp_path)
    assert [s.role for s in both] == ["model", "kt-weights"]
    assert both[1].repo == "KVCache-ai/Kimi-K2-Thinking-CPU-weight" and both[1].patterns == ()
    assert len({s.key for s in both}) == 2  # one job each
