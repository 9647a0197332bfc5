"""``ktctl catalog``'s text, from the report the daemon would send for the AVX2 box (no
colour: plain text on a terminal as in a pipe)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ktctl.catalogcmd import entry_text, list_text
from ktd.catalog import layout
from ktd.catalog.load import load
from ktd.catalog.ondisk import revision_dir
from ktd.catalog.report import build
from tests.catalog.machines import avx2_box


def test_the_list_on_the_avx2_box(tmp_path: Path) -> None:
    topo = avx2_box(tmp_path / "box")
    part = revision_dir(tmp_path / "models", "moonshotai/Kimi-K2-Thinking", "d" * 40)
    partial = layout.partial_path(part, "e" * 64)  # as the pull jobs keep it
    partial.parent.mkdir(parents=True)
    with partial.open("wb") as f:
        f.truncate(3_000_000_000)  # sparse: 3 GB fetched so far
    text = list_text(build(load(), topo, str(tmp_path / "models")))
    assert (
        "this box: AMD Ryzen Threadripper 3970X 32-Core Processor: avx2, 32 cores, 1 NUMA node"
        in text
    )
    rows = {
        line.split()[0]: re.split(r"\s{2,}", line)
        for line in text.splitlines()
        if line[:1].islower()
    }
    assert rows["kimi-k2-thinking"] == ["kimi-k2-thinking", "kimi-k2", "none", "partial (3 GB)"]
    assert rows["deepseek-v4-flash"] == ["deepseek-v4-flash", "deepseek-v4", "mxfp4 (MXFP4)", "-"]
    assert "\x1b[" not in text


def test_an_entry_that_fits_nowhere_says_why_for_each_variant(tmp_path: Path) -> None:
    topo = avx2_box(tmp_path / "box")
    text = entry_text(build(load(), topo, str(tmp_path / "models"), "deepseek-v3.2"))
    assert "variant: none fits this box: amxint4: --kt-method AMXINT4 needs" in text
    assert (
        "  x fp8-avx2 (FP8, weights: model)\n      no: needs 350 GB of RAM; this box has 275 GB"
        in text
    )
    assert "needs: disk 1,000 GB, RAM 350 GB, GPU 27 GB" in text
    assert "flags for this box" not in text  # nothing to launch


def test_an_entry_with_its_flags_and_arithmetic(tmp_path: Path) -> None:
    topo = avx2_box(tmp_path / "box")
    text = entry_text(build(load(), topo, os.fspath(tmp_path / "models"), "deepseek-v4-kt"))
    assert "  --kt-method MXFP4  " in text and "derived" in text
    assert "  --kt-threadpool-count 1 " in text
    assert "--kt-num-gpu-experts:\n  before the files are here, kt's registry formula:" in text
