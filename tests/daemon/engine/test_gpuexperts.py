"""``ktd.daemon.engine.gpuexperts``'s state file: counts kept per host (another host's never
used here), a file that is not one read as nothing kept, and doctor's lines."""

from __future__ import annotations

import json
from pathlib import Path

from ktd.core.config import ModelSpec
from ktd.daemon.engine.gpuexperts import FILE, ExpertsKeeper


def spec(alias: str, catalog: str = "deepseek-v4-kt", count: str = "40") -> ModelSpec:
    return ModelSpec(
        alias=alias,
        backend="kt",
        path="/m",
        served=True,
        source="test",
        catalog=catalog,
        extra_args=("--kt-method", "AMXINT4", "--kt-num-gpu-experts", count),
    )


def test_counts_are_kept_per_host(tmp_path: Path) -> None:
    path = tmp_path / FILE
    rows = {"v4": {"derived": 40, "kept": 30, "at": 1.0}}
    path.write_text(
        json.dumps({"hosts": {"here": rows, "there": {"v4": {**rows["v4"], "kept": 12}}}})
    )
    here = ExpertsKeeper(path, host="here")
    assert here.machine.launch("v4", 40) == 30
    assert here.machine.launch("v4", 36) == 36  # written again for another card: derived
    assert ExpertsKeeper(path, host="elsewhere").machine.launch("v4", 40) == 40
    [line] = here.checks({"v4": spec("v4"), "mine": spec("mine", catalog="")})
    assert line.name == "gpu experts v4" and line.status == "ok"
    assert "--kt-num-gpu-experts 40 derived from the catalog (deepseek-v4-kt)" in line.detail
    assert "30 kept on here after an out-of-memory load (launches with 30)" in line.detail


def test_a_file_that_is_no_state_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / FILE
    for text in ("{", "[]", '{"hosts": []}', '{"hosts": {"h": {"v4": {"kept": "x"}}}}'):
        path.write_text(text)
        keeper = ExpertsKeeper(path, host="h")
        assert keeper.machine.launch("v4", 40) == 40, text
        assert keeper.report({"v4": spec("v4")})[0]["kept"] is None
