"""The usage ledger on disk: written before the reply, read back by a restarted daemon, a
corrupt file set aside, a resent batch not added twice across a restart."""

from __future__ import annotations

import json
from pathlib import Path

from ktd import protocol as p
from ktd.daemon.usage import UsageStore

NOW = 1_796_000_000.0  # 2026-11-30 UTC
DAY = "2026-11-30"


def count(key: str = "alice", model: str = "m1", **n: int) -> p.UsageCount:
    return p.UsageCount(day=DAY, key=key, model=model, **n)


def store(path: Path, now: float = NOW) -> UsageStore:
    return UsageStore(path, clock=lambda: now)


def test_a_batch_is_on_disk_when_report_returns_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    s = store(path)
    s.report("fe-1", 1, [count(requests=2, prompt=5, completion=7)])
    assert json.loads(path.read_bytes())["clients"] == {"fe-1": {"seq": 1, "day": DAY}}
    again = store(path)  # kill -9 and start: what was written is what there is
    assert again.rows() == [count(requests=2, prompt=5, completion=7)]
    assert again.acked("fe-1") == 1
    again.report("fe-1", 1, [count(requests=2, prompt=5, completion=7)])  # its resend
    assert again.rows()[0].requests == 2
    assert again.spent() == (DAY, {"alice": 12})


def test_rows_are_asked_for_by_day_and_key(tmp_path: Path) -> None:
    s = store(tmp_path / "usage.json")
    older = p.UsageCount(day="2026-11-29", key="bob", model="m2", requests=1)
    s.report("fe", 1, [count(requests=1), older, count(key="", requests=3)])
    assert [(r.day, r.key) for r in s.rows()] == [("2026-11-29", "bob"), (DAY, ""), (DAY, "alice")]
    assert [r.key for r in s.rows(since=DAY)] == ["", "alice"]
    assert [r.day for r in s.rows(key="bob")] == ["2026-11-29"]
    assert s.rows(key="") == [count(key="", requests=3)]


def test_a_corrupt_ledger_is_set_aside_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    path.write_bytes(b'{"version": 1, "rows": [{"day": "yesterday"')
    s = store(path)
    assert s.rows() == []
    (aside,) = tmp_path.glob("usage.json.corrupt-*")
    assert aside.read_bytes().startswith(b'{"version": 1')
    s.report("fe", 1, [count(requests=1)])
    assert store(path).rows() == [count(requests=1)]


def test_rows_older_than_a_year_go_at_start(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    old = p.UsageCount(day="2025-10-01", model="m1", requests=1)
    store(path, now=NOW - 400 * 86400).report("fe", 1, [old, count(requests=1)])
    assert store(path).rows() == [count(requests=1)]
    assert json.loads(path.read_bytes())["clients"] == {}  # silent for 400 days


def test_without_a_state_directory_it_counts_in_memory(tmp_path: Path) -> None:
    s = UsageStore(None)
    s.report("fe", 1, [count(requests=1)])
    s.report("fe", 0, [])  # a report with nothing to add
    assert s.rows()[0].requests == 1 and list(tmp_path.iterdir()) == []
