"""The usage ledger on disk: a batch journaled before the reply, read back by a restarted
daemon, written whole every so often without a count lost or added twice by a crash at any
step, a corrupt file set aside, a resent batch not added twice across a restart."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ktd import protocol as p
from ktd.daemon.pool import statefile, usage
from ktd.daemon.pool.usage import UsageStore

NOW = 1_796_000_000.0  # 2026-11-30 UTC
DAY = "2026-11-30"


def count(key: str = "alice", model: str = "m1", **n: int) -> p.UsageCount:
    return p.UsageCount(day=DAY, key=key, model=model, **n)


def store(path: Path, now: float = NOW) -> UsageStore:
    return UsageStore(path, clock=lambda: now)


def journal(path: Path) -> list[dict[str, Any]]:
    """The journal's lines: its head, then one per batch."""
    lines = path.with_name("usage.json.journal").read_bytes().splitlines()
    return [json.loads(line) for line in lines]


def json_count(requests: int, prompt: int = 0, completion: int = 0) -> dict[str, Any]:
    return msgspec.to_builtins(count(requests=requests, prompt=prompt, completion=completion))


def test_a_batch_is_on_disk_when_report_returns_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    s = store(path)
    s.report("fe-1", 1, [count(requests=2, prompt=5, completion=7)])
    head, line = journal(path)
    assert line == {"client": "fe-1", "seq": 1, "day": DAY, "counts": [json_count(2, 5, 7)]}
    assert json.loads(path.read_bytes())["absorbed"] != head["journal"]  # not written whole yet
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


def test_every_compact_every_lines_the_ledger_is_written_whole_and_a_journal_begins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage, "COMPACT_EVERY", 3)
    path = tmp_path / "usage.json"
    s = store(path)
    for seq in (1, 2):
        s.report("fe", seq, [count(requests=1)])
    first = journal(path)[0]["journal"]
    assert len(journal(path)) == 3 and json.loads(path.read_bytes())["rows"] == []
    s.report("fe", 3, [count(requests=1)])
    whole = json.loads(path.read_bytes())
    assert whole["absorbed"] == first and whole["rows"][0]["requests"] == 3
    assert whole["clients"] == {"fe": {"seq": 3, "day": DAY}}
    assert [list(line) for line in journal(path)] == [["journal"]]  # a new one, empty
    assert journal(path)[0]["journal"] != first
    assert store(path).rows() == [count(requests=3)]


def test_a_crash_between_the_whole_write_and_the_new_journal_adds_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole ledger is on disk, absorbing journal J; J itself is still there. J's
    batches must not be added again, even from a frontend the whole write forgot (silent
    for a week, so no number of its own says the batch is in)."""
    monkeypatch.setattr(usage, "COMPACT_EVERY", 2)
    path = tmp_path / "usage.json"
    now = [NOW]
    s = UsageStore(path, clock=lambda: now[0])
    s.report("fe-old", 1, [count(requests=1)])
    old = path.with_name("usage.json.journal").read_bytes()
    now[0] += 8 * 86400
    s.report("fe", 1, [count(requests=1)])  # written whole (fe-old forgotten), a new journal...
    assert set(json.loads(path.read_bytes())["clients"]) == {"fe"}
    path.with_name("usage.json.journal").write_bytes(old)  # ...that the crash never made
    again = UsageStore(path, clock=lambda: now[0])
    assert again.rows() == [count(requests=2)] and again.acked("fe-old") == 0
    again.report("fe", 2, [count(requests=1)])
    assert store(path, now[0]).rows() == [count(requests=3)]


def test_a_line_a_crash_cut_short_is_dropped_and_its_batch_taken_again(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    store(path).report("fe", 1, [count(requests=1)])
    store(path)  # a start writes the journal's lines whole: a new, empty journal
    with path.with_name("usage.json.journal").open("ab") as f:
        f.write(b'{"client": "fe", "seq": 2, "day": "2026-')  # no fsync returned: no reply
    again = store(path)
    assert again.rows() == [count(requests=1)] and again.acked("fe") == 1
    again.report("fe", 2, [count(requests=1)])  # the frontend sends it again
    assert store(path).rows() == [count(requests=2)]


def test_a_journal_that_does_not_decode_is_set_aside_and_what_came_before_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "usage.json"
    s = store(path)
    s.report("fe", 1, [count(requests=1)])
    jpath = path.with_name("usage.json.journal")
    jpath.write_bytes(
        jpath.read_bytes() + b"garbage\n" + jpath.read_bytes().splitlines()[1] + b"\n"
    )
    again = store(path)
    assert again.rows() == [count(requests=1)]
    assert len(list(tmp_path.glob("usage.json.journal.corrupt-*"))) == 1
    again.report("fe", 2, [count(requests=1)])
    assert store(path).rows() == [count(requests=2)]


def test_after_a_failed_line_the_next_batch_writes_the_ledger_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk cuts a line short and the whole write fails too: the batch stays in
    memory, and the next one is not appended after the cut line (it would make every
    later line unreadable) but written whole with it."""
    path = tmp_path / "usage.json"
    s = store(path)
    s.report("fe", 1, [count(requests=1)])

    def half(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(statefile, "write_all", half)
        m.setattr(statefile, "write_bytes", full)
        s.report("fe", 2, [count(requests=1)])
    assert s.rows() == [count(requests=2)]  # counted; durable with the next write
    s.report("fe", 3, [count(requests=1)])
    again = store(path)
    assert again.rows() == [count(requests=3)] and again.acked("fe") == 3
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_an_older_ledger_without_cut_reads_and_cut_requests_add_up(tmp_path: Path) -> None:
    """Issue 43: the ledger counts requests whose client went away (``cut``); a file an
    older ktd wrote has no such field and reads as none cut."""
    path = tmp_path / "usage.json"
    old = {"version": 1, "rows": [{"day": DAY, "key": "alice", "model": "m1", "requests": 3}]}
    path.write_text(json.dumps(old))
    s = store(path)
    s.report("fe-1", 1, [count(requests=2, completion=4, cut=1)])
    s.report("fe-1", 2, [count(requests=1, completion=1, cut=1)])
    assert s.rows() == [count(requests=6, completion=5, cut=2)]
    assert store(path).rows() == s.rows()  # and after a restart


def test_what_each_frontend_holds_is_told_to_the_others() -> None:
    """``Sync.reserved`` in, ``SyncReply.held`` out: the others' sum, never one's own."""
    s = UsageStore(None, clock=lambda: NOW)
    assert s.report("fe-1", 0, [], {"alice": 280})  # changed: the others hear at once
    assert not s.report("fe-1", 0, [], {"alice": 280})
    assert s.report("fe-2", 0, [], {"alice": 20, "bob": 5})
    reply = p.SyncReply()
    s.answer("fe-2", reply)
    assert (reply.held, reply.day) == ({"alice": 280}, DAY)
    s.answer("fe-3", reply)
    assert reply.held == {"alice": 300, "bob": 5}
    assert s.report("fe-1", 0, [])  # an older frontend's report: nothing held
    s.holds.forget(["fe-2"])
    s.answer("fe-3", reply)
    assert reply.held == {}
