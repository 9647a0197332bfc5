"""A pull's plan (``ktd.catalog.plan.make_plan``, pure): bytes to fetch and present, the
margin, and a refusal that names the numbers; ``scan`` and the layout's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktd.catalog import layout
from ktd.catalog.plan import MARGIN_MIN, HubFile, HubMeta, make_plan, scan

GiB = 1 << 30
META = HubMeta(
    repo="org/m",
    revision="main",
    commit="c" * 40,
    files=(
        HubFile(name="config.json", size=100, blob_id="b" * 40),
        HubFile(name="model-00001.safetensors", size=300 * GiB, sha256="a" * 64),
    ),
)


def test_the_plan_counts_what_is_here_and_keeps_a_margin() -> None:
    plan = make_plan(
        META, Path("/m"), {"config.json": 100, "model-00001.safetensors": GiB}, 1000 * GiB
    )
    assert plan.total == 300 * GiB + 100 and plan.present == GiB + 100
    assert plan.to_fetch == 299 * GiB and plan.margin == int(299 * GiB * 0.02)
    assert plan.fits_disk and plan.problems == ()
    assert [f.lfs for f in plan.files] == [False, True]


def test_a_short_disk_is_refused_with_the_numbers() -> None:
    plan = make_plan(META, Path("/m"), {}, 200 * GiB)
    assert not plan.fits_disk
    [problem] = plan.problems
    assert "300.00 GiB to fetch" in problem and "200.00 GiB free" in problem and "short" in problem


def test_nothing_to_fetch_fits_any_disk() -> None:
    have = {f.name: f.size for f in META.files}
    plan = make_plan(META, Path("/m"), have, 0)
    assert plan.to_fetch == 0 and plan.margin == 0 and plan.fits_disk


def test_a_small_pull_keeps_the_minimum_margin() -> None:
    small = HubMeta(repo="o/s", revision="main", commit="c", files=(HubFile(name="a", size=10),))
    assert make_plan(small, Path("/m"), {}, 1 << 40).margin == MARGIN_MIN


def test_scan_takes_whole_files_partial_ones_and_not_flagged_ones(tmp_path: Path) -> None:
    meta = HubMeta(
        repo="o/s",
        revision="main",
        commit="c",
        files=(
            HubFile(name="a", size=4),
            HubFile(name="b", size=8, sha256="f" * 64),
            HubFile(name="sub/c", size=2),
        ),
    )
    (tmp_path / "a").write_bytes(b"1234")
    partial = layout.partial_path(tmp_path, "f" * 64)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"123")
    assert scan(meta, tmp_path) == {"a": 4, "b": 3}
    assert scan(meta, tmp_path, frozenset({"a"})) == {"b": 3}


@pytest.mark.parametrize(
    ("repo", "revision"),
    [
        ("org", "main"),
        ("org/../x", "main"),
        ("org/m", "../main"),
        ("org/m", "a/b"),
        ("/org/m", "main"),
    ],
)
def test_a_source_that_is_no_hub_name_is_refused(repo: str, revision: str) -> None:
    with pytest.raises(layout.BadSource):
        layout.dest_for(Path("/models"), repo, revision)


def test_the_layout_is_org_dash_dash_name_slash_revision() -> None:
    assert layout.dest_for(Path("/models"), "deepseek-ai/DeepSeek-V3", "abc123") == Path(
        "/models/deepseek-ai--DeepSeek-V3/abc123"
    )
