"""The daemon's side of ``catalog``: where the models go, the files the config names
(relative to config.json), the machine read as placement reads it, an unknown name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core.config import Config
from ktd.core.configload import load_config
from ktd.daemon.catalog.view import catalog_dir, report
from tests.catalog.machines import AVX2_GPUS, avx2_machine, tree


def config(tmp_path: Path, catalog: dict[str, object]) -> Config:
    etc = tmp_path / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "models.json").write_text("[]")
    (etc / "config.json").write_text(json.dumps({"models_file": "models.json", "catalog": catalog}))
    return load_config(str(etc / "config.json"))


def test_where_pulled_models_go(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert catalog_dir(config(tmp_path, {}), state) == state / "models"
    rel = config(tmp_path, {"dir": "models"})
    assert catalog_dir(rel, state) == tmp_path / "etc" / "models"
    absolute = config(tmp_path, {"dir": str(tmp_path / "big")})
    assert catalog_dir(absolute, state) == tmp_path / "big"


def test_the_report_reads_the_configs_files_and_the_fixture_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, smi = tree(tmp_path / "machine", avx2_machine(), AVX2_GPUS)
    monkeypatch.setenv("KTD_SYSFS_ROOT", str(fs))
    monkeypatch.setenv("KTD_NVIDIA_SMI", str(smi))
    tiny = Path(__file__).parents[2] / "catalog" / "tiny.json"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "mine.json").write_text("[]")
    cfg = config(tmp_path, {"files": [str(tiny), "mine.json"]})
    doc = report(cfg, tmp_path / "state", None)
    assert doc["box"]["isa"] == "avx2"
    assert [q["file"] for q in doc["problems"]] == [str(tmp_path / "etc" / "mine.json")]
    assert any(m["name"] == "tiny-qwen2" for m in doc["models"])
    with pytest.raises(ControlError) as err:
        report(cfg, tmp_path / "state", "nope")
    assert err.value.code == p.ErrorCode.UNKNOWN_MODEL and "tiny-qwen2" in err.value.detail["known"]


def test_a_configured_models_own_flags_win_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, smi = tree(tmp_path / "machine", avx2_machine(), AVX2_GPUS)
    monkeypatch.setenv("KTD_SYSFS_ROOT", str(fs))
    monkeypatch.setenv("KTD_NVIDIA_SMI", str(smi))
    config(tmp_path, {})
    mine = [
        {
            "path": str(tmp_path / "v4"),
            "backend": "kt",
            "alias": "deepseek-v4-kt",
            "kt": {"extra_args": ["--kt-num-gpu-experts", "3"]},
        }
    ]
    (tmp_path / "etc" / "models.json").write_text(json.dumps(mine))
    cfg = load_config(str(tmp_path / "etc" / "config.json"))
    [model] = report(cfg, tmp_path / "state", "deepseek-v4-flash")["models"]
    flags = {f["flag"]: f for f in model["flags"]["flags"]}
    assert flags["--kt-num-gpu-experts"]["values"] == ["3"]
    assert flags["--kt-num-gpu-experts"]["origin"] == "user"
    assert flags["--kt-method"]["origin"] == "derived"


@pytest.mark.parametrize(("numa", "refused"), [([0], True), ("all", False)])
def test_hand_converted_amx_weights_are_read_and_checked_against_the_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, numa: object, refused: bool
) -> None:
    from tests.catalog.machines import AMX_GPUS, amx_machine
    from tests.catalog.test_ondisk import amx_keys, safetensors

    fs, smi = tree(tmp_path / "machine", amx_machine(), AMX_GPUS)
    monkeypatch.setenv("KTD_SYSFS_ROOT", str(fs))
    monkeypatch.setenv("KTD_NVIDIA_SMI", str(smi))
    int4 = tmp_path / "v3.2-INT4"
    int4.mkdir()
    safetensors(int4 / "model-00001-of-00001.safetensors", amx_keys(2))
    config(tmp_path, {})
    mine = [
        {
            "path": str(tmp_path / "v3.2"),
            "backend": "kt",
            "alias": "deepseek-v3.2",
            "numa": numa,
            "kt": {"kt_weight_path": str(int4)},
        }
    ]
    (tmp_path / "etc" / "models.json").write_text(json.dumps(mine))
    cfg = load_config(str(tmp_path / "etc" / "config.json"))
    [model] = report(cfg, tmp_path / "state", "deepseek-v3.2")["models"]
    assert model["configured"] and model["choice"]["chosen"] == "amxint4"  # converted: runnable
    assert model["numa_counts"] == {"amxint4": 2}
    refusals = model["flags"]["refusals"]
    assert bool(refusals) is refused
    if refused:
        assert "converted for 2 NUMA pools but the placement gives 1" in refusals[0]
