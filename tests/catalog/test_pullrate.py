"""``ktd.catalog.pullrate``: a finished pull's rate kept, replaced by the next, and a file
that is not one read as no rate (never an error)."""

from __future__ import annotations

from pathlib import Path

from ktd.catalog import pullrate


def test_a_rate_is_kept_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "state" / pullrate.FILE
    assert pullrate.read(path) is None
    got = pullrate.record(path, 10 << 20, 2.0, now=100.0)
    assert got is not None and got.per_second == 5 << 20
    assert pullrate.read(path) == got
    pullrate.record(path, 4 << 20, 4.0, now=200.0)
    again = pullrate.read(path)
    assert again is not None and again.per_second == 1 << 20 and again.at == 200.0


def test_a_pull_that_fetched_nothing_measures_nothing(tmp_path: Path) -> None:
    path = tmp_path / pullrate.FILE
    pullrate.record(path, 8, 1.0, now=1.0)
    assert pullrate.record(path, 0, 3.0) is None and pullrate.record(path, 5, 0.0) is None
    kept = pullrate.read(path)
    assert kept is not None and kept.bytes == 8  # the last real measure stays


def test_a_file_that_is_no_rate_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / pullrate.FILE
    for text in ("", "[]", '{"bytes": "x", "seconds": 1, "at": 0}', '{"bytes": 5}', "{"):
        path.write_text(text)
        assert pullrate.read(path) is None, text
    path.write_text('{"bytes": -5, "seconds": 1, "at": 0}')
    assert pullrate.read(path) is None
