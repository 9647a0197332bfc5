"""The models.json entry of a finished pull, built from the pulled directories for this
box (the AMX fixture machine): the flags derived with their numbers, under the name the
pull was asked by; a directory the pull did not verify writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktd.catalog import verify
from ktd.catalog.modelsentry import EntryError
from ktd.core.config import Config
from ktd.core.configload import load_config
from ktd.daemon.catalog.entry import build_entry
from ktd.daemon.catalog.resolver import CatalogPulls
from tests.catalog.machines import amx_box


def config(tmp_path: Path) -> Config:
    etc = tmp_path / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "models.json").write_text("[]")
    cfg = {"models_file": "models.json", "catalog": {"dir": str(tmp_path / "models")}}
    (etc / "config.json").write_text(json.dumps(cfg))
    return load_config(str(etc / "config.json"))


def pulled(dest: Path, repo: str) -> None:
    """The directory as a finished pull leaves it (a config.json, the verified marker)."""
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps({"n_routed_experts": 256}))
    size = (dest / "config.json").stat().st_size
    verify.write_marker(
        dest,
        verify.Marker(
            repo=repo,
            revision=dest.name,
            commit="c" * 40,
            files=(verify.Checked(name="config.json", size=size),),
        ),
    )


def test_the_entry_of_a_pulled_name_for_this_box(tmp_path: Path) -> None:
    topo = amx_box(tmp_path / "box")
    cfg = config(tmp_path)
    res = CatalogPulls(lambda: cfg, tmp_path / "state", machine=lambda: topo).resolution(
        "deepseek-v4-kt"
    )
    [spec] = res.resolved.specs
    with pytest.raises(EntryError, match="no verified pull here"):
        build_entry(res)  # nothing pulled yet: no entry
    pulled(Path(spec.dest), spec.repo)
    entry = build_entry(res)
    assert entry["alias"] == "deepseek-v4-kt"  # the name it was pulled by
    assert entry["path"] == spec.dest and entry["kt"]["kt_weight_path"] == spec.dest
    args = entry["kt"]["extra_args"]
    assert args[args.index("--kt-method") + 1] == "MXFP4"
    experts = int(args[args.index("--kt-num-gpu-experts") + 1])
    assert 0 < experts <= 256
    # placement's flags are derived at each launch, never written
    assert "--kt-cpuinfer" not in args and "--kt-threadpool-count" not in args
