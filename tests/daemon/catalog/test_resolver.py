"""The catalog as the pull jobs see it: a name (or alias) resolved against the running
config's catalog files, re-read at each pull (a reload's new file counts at once); the
fit check refuses a plan of what this box cannot run, with the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktd import protocol as p
from ktd.catalog.plan import PullPlan
from ktd.control.errors import ControlError
from ktd.core.config import Config
from ktd.core.configload import load_config
from ktd.daemon.catalog.resolver import CatalogPulls
from tests.catalog.machines import amx_box, avx2_box

TINY = Path(__file__).parents[2] / "catalog" / "tiny.json"


def config(tmp_path: Path, catalog: dict[str, object]) -> Config:
    etc = tmp_path / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "models.json").write_text("[]")
    (etc / "config.json").write_text(json.dumps({"models_file": "models.json", "catalog": catalog}))
    return load_config(str(etc / "config.json"))


def plan(repo: str, revision: str = "main") -> PullPlan:
    return PullPlan(
        repo=repo, revision=revision, commit="c" * 40, dest="/d", files=(),
        total=0, present=0, to_fetch=0, free=1 << 40, margin=0,
    )  # fmt: skip


def test_a_name_the_box_cannot_run_is_refused_with_the_numbers(tmp_path: Path) -> None:
    topo = avx2_box(tmp_path / "box")
    cfg = config(tmp_path, {"dir": "models"})
    cat = CatalogPulls(lambda: cfg, tmp_path / "state", machine=lambda: topo)
    specs = cat.resolve("k2-thinking")
    assert [s.role for s in specs] == ["model", "kt-weights"]
    assert specs[0].dest == str(
        tmp_path / "etc" / "models" / "moonshotai--Kimi-K2-Thinking" / "main"
    )
    problems = cat.fit(plan("moonshotai/Kimi-K2-Thinking"))
    assert any("needs 650 GB of RAM; this box has 275 GB" in q for q in problems), problems
    assert cat.fit(plan("KVCache-ai/Kimi-K2-Thinking-CPU-weight")) == problems
    assert cat.fit(plan("org/not-a-catalog-repo")) == []  # a --repo pull: nothing to judge


def test_a_name_the_box_runs_passes(tmp_path: Path) -> None:
    topo = amx_box(tmp_path / "box")
    cfg = config(tmp_path, {})
    cat = CatalogPulls(lambda: cfg, tmp_path / "state", machine=lambda: topo)
    [spec] = cat.resolve("deepseek-v4-kt")
    assert spec.dest.startswith(str(tmp_path / "state" / "models"))
    assert cat.fit(plan(spec.repo)) == []


def test_the_running_configs_files_are_read_at_each_pull(tmp_path: Path) -> None:
    topo = amx_box(tmp_path / "box")
    running = [config(tmp_path, {})]
    cat = CatalogPulls(lambda: running[0], tmp_path / "state", machine=lambda: topo)
    with pytest.raises(ControlError) as err:
        cat.resolve("ktd-tiny")
    assert err.value.code == p.ErrorCode.UNKNOWN_MODEL
    assert "no catalog entry is called 'ktd-tiny'" in err.value.message
    running[0] = config(tmp_path, {"files": [str(TINY)]})  # what a reload installs
    [spec] = cat.resolve("ktd-tiny")
    assert spec.repo == "ktd-tests/tiny-qwen2"
