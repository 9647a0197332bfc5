"""Engine log lines: load phases from SGLang's milestones; ktd's probe lines told apart."""

from __future__ import annotations

import json
from pathlib import Path

from ktctl import render
from ktd import protocol as p
from ktd.core.loglines import (
    Seam,
    is_probe_access,
    overlap,
    percent_of,
    phase_of,
    split_probe_access,
)
from ktd.daemon.pool.loadhistory import LoadHistory

HEALTH = '[2026-12-01 10:00:00] INFO:     127.0.0.1:5 - "GET /health?ktd=probe HTTP/1.1" 200 OK'
MODELS = '[2026-12-01 10:00:00] INFO:     127.0.0.1:5 - "GET /v1/models?ktd=probe HTTP/1.1" 200'
CLIENT = '[2026-12-01 10:00:00] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK'
CHAT = '[2026-12-01 10:00:00] INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200'


def test_milestones_become_phases() -> None:
    assert phase_of("[2026 TP0] Load weight begin. avail mem=70.00 GB") == "loading weights"
    assert phase_of("[2026] Uvicorn running on http://127.0.0.1:30000") == "warming up"
    assert phase_of("[2026 TP0] Prefill batch. #new-seq: 1") is None


def test_a_progress_bars_percentage_as_sglang_prints_it() -> None:
    # SGLang's own BAR_FORMAT (sglang/srt/utils/common.py), and tqdm's default (the CUDA
    # graph capture's bar); a redrawn line's last frame counts.
    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.2it/s]"
    assert percent_of(bar) == 50.0
    assert percent_of("Capturing batches (bs=8 avail_mem=3.10 GB):  25%|##5  | 1/4 [00:01<]") == 25
    assert percent_of("x:   0% Completed | 0/9\rx: 100% Completed | 9/9") == 100.0
    assert percent_of("Load weight begin. avail mem=20% free") is None
    assert percent_of("nonsense 900% Completed | 1/1") is None


def test_probe_access_lines_are_told_apart() -> None:
    assert is_probe_access(HEALTH) and is_probe_access(MODELS)
    assert not is_probe_access(CHAT)
    assert not is_probe_access(CLIENT)  # a client's (or a router's) own health check stays
    assert not is_probe_access("GET /health is what ktd polls")  # not an access line
    assert split_probe_access([CHAT, HEALTH, "x", MODELS]) == ([CHAT, "x"], [HEALTH, MODELS])


def test_load_history_keeps_recent_median_and_survives_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "state" / "load_history.json"
    h = LoadHistory(path, keep=3)
    assert h.expected("m") is None
    for s in (100.0, 10.0, 30.0, 20.0):
        h.record("m", s)
    assert h.loads["m"] == [10.0, 30.0, 20.0] and h.expected("m") == 20.0
    assert LoadHistory(path, keep=3).expected("m") == 20.0  # read back from the file
    assert json.loads(path.read_text())["version"] == 1
    assert not list(path.parent.glob(".load_history.*"))  # no temp file left
    path.write_text("{broken")
    assert LoadHistory(path).expected("m") is None
    LoadHistory(None).record("m", 1.0)  # no state dir: memory only


def test_progress_line_shows_expected_time_and_evictions() -> None:
    prog = render.LoadProgress("m", started=100.0)
    prog.update(
        p.Event(
            topic="engine.m", time=0, alias="m", state="starting",
            phase="stopping old-kt to make room", load_eta=300.0,
        )
    )  # fmt: skip
    line = prog.line(160.0, 200)
    assert line == "m starting (stopping old-kt to make room) 1m00s/~5m00s"


def test_overlap() -> None:
    assert overlap(["a", "b"], ["b", "c"]) == 1
    assert overlap(["a", "b"], ["a", "b", "c"]) == 2
    assert overlap(["a", "b"], ["c"]) == 0
    assert overlap([], ["c"]) == 0
    assert overlap(["x", "a", "b"], ["a", "b"]) == 2


def test_a_seam_without_counts_cuts_the_early_batches_by_text() -> None:
    """A daemon whose events carry no count: the early batches lose the tail's end."""
    seam = Seam(["a", "b"])
    assert seam.opening([(0, ["b"]), (0, ["c"])]) == ["c"]
    assert seam.fresh(0, ["d"]) == ["d"]


def test_a_seam_with_counts_drops_what_the_tail_holds_and_keeps_repeats() -> None:
    seam = Seam(["x", "x"], upto=2)
    assert seam.opening([(1, ["x"]), (2, ["x"]), (3, ["x"])]) == ["x"]
    assert seam.fresh(2, ["late"]) == ["late"]  # past the first newer batch: no filter
