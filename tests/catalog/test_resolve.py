"""A catalog name -> the entry, the variant this box runs, the pull's specs under
catalog.dir, and the reasons this box cannot run it (with the numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktd.catalog import layout
from ktd.catalog.load import load
from ktd.catalog.resolve import UnknownName, resolve
from tests.catalog.machines import amx_box, avx2_box

CAT = load()


def test_an_alias_resolves_to_the_variant_this_box_runs(tmp_path: Path) -> None:
    topo = amx_box(tmp_path / "box")
    r = resolve(CAT, topo, tmp_path / "models", "deepseek-v4-kt")
    assert (r.entry.name, r.variant.name, r.fits) == ("deepseek-v4-flash", "mxfp4", True)
    [spec] = r.specs
    assert (spec.role, spec.repo, spec.revision) == (
        "model",
        "deepseek-ai/DeepSeek-V4-Flash",
        "main",
    )
    # the pull jobs' layout: the directory a load's --model-path is
    assert spec.dest == str(layout.dest_for(tmp_path / "models", spec.repo, "main"))


def test_an_amx_box_pulls_the_upload_too(tmp_path: Path) -> None:
    r = resolve(CAT, amx_box(tmp_path / "box"), tmp_path / "m", "kimi-k2-thinking")
    assert r.variant.name == "amxint4" and r.fits
    assert [s.role for s in r.specs] == ["model", "kt-weights"]


def test_a_box_that_cannot_run_it_gets_every_variants_reasons_with_numbers(
    tmp_path: Path,
) -> None:
    r = resolve(CAT, avx2_box(tmp_path / "box"), tmp_path / "m", "kimi-k2-thinking")
    assert not r.fits
    [text] = r.problems
    assert text.startswith(
        "this box cannot run kimi-k2-thinking: amxint4 (AMXINT4): --kt-method AMXINT4 needs"
    )
    assert " | rawint4 (RAWINT4): --kt-method RAWINT4 needs avx512f, avx512bw;" in text
    assert "needs 650 GB of RAM; this box has 275 GB" in text
    # forced, it fetches the first variant: what a box that can run it would get
    assert r.variant.name == "amxint4" and len(r.specs) == 2


def test_an_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(UnknownName):
        resolve(CAT, amx_box(tmp_path / "box"), tmp_path / "m", "no-such-model")
