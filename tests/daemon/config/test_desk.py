"""The config desk in-process: a real pool (not running: the test plays the supervisor),
real files, the real probe of the sim's SGLang; the writer injected where a test needs a
slow or a full disk (issue 39)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import configtext
from ktd.core import states as S
from ktd.core.configload import parse_config, read_config_texts
from ktd.daemon.config import files as configfiles
from ktd.daemon.config.desk import ConfigDesk, Who
from ktd.daemon.config.files import FileChange
from ktd.daemon.config.history import History
from ktd.daemon.pool.pool import Pool
from tests.conftest import ConfigWriter, sim_model

ALICE = Who(uid=1000, claimed="alice")  # in daemon.admins (``make``): not ktd's owner


@dataclass
class Bench:
    desk: ConfigDesk
    pool: Pool
    models: Path
    config: Path
    writes: list[list[FileChange]]

    def models_text(self) -> str:
        return self.models.read_text()


def make(
    tmp_path: Path,
    write: Callable[[Sequence[FileChange]], None] | None = None,
    **daemon: Any,
) -> Bench:
    daemon.setdefault("admins", [ALICE.uid])
    cfg = ConfigWriter(tmp_path / "etc")([sim_model("a"), sim_model("b", ttl=600)], daemon=daemon)
    texts = read_config_texts(cfg)
    config = parse_config(texts)
    pool = Pool(
        config,
        log_dir=tmp_path / "logs",
        publish=lambda topic, event: None,
        state_path=tmp_path / "state" / "engines.json",
    )
    writes: list[list[FileChange]] = []

    def writer(changes: Sequence[FileChange]) -> None:
        writes.append(list(changes))
        (write or configfiles.write_files)(changes)

    desk = ConfigDesk(
        config,
        texts,
        pool,
        install=pool.apply_config,
        history=History(tmp_path / "state" / "config-history", config.daemon.config_history + 1),
        write=writer,
    )
    return Bench(desk, pool, cfg.parent / "models.json", cfg, writes)


async def test_an_apply_writes_records_and_installs(tmp_path: Path) -> None:
    b = make(tmp_path)
    await b.desk.record_start()
    got = await b.desk.get(None)
    text = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    reply = await b.desk.apply(None, text, got.version, ALICE)
    assert b.models_text() == text
    assert b.pool.engines["a"].spec.ttl == 30
    assert (b.desk.running, reply.seq) == (reply.version, 2)
    v = b.desk.history.infos()[0]
    assert (v.how, v.uid, v.claimed, v.what) == ("apply", 1000, "alice", "update: a (ttl)")
    assert v.files == [str(b.models)]


async def test_two_writers_at_once_one_wins_the_other_is_stale(tmp_path: Path) -> None:
    """The second apply, made from the same version, waits for the first (one lock) and
    then finds the files changed: refused, not written over."""
    slow, writing = trio.Event(), trio.Event()

    def write(changes: Sequence[FileChange]) -> None:
        trio.from_thread.run_sync(writing.set)
        trio.from_thread.run(slow.wait)  # a slow disk: the first writer sits here
        configfiles.write_files(changes)

    b = make(tmp_path, write)
    got = await b.desk.get(None)
    first = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    second = configtext.set_fields(got.models_text or "", "b", {"ttl": 5})
    outcome: dict[str, Any] = {}

    async def apply(name: str, text: str) -> None:
        try:
            outcome[name] = await b.desk.apply(None, text, got.version, ALICE)
        except ControlError as exc:
            outcome[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(apply, "first", first)
        await writing.wait()
        nursery.start_soon(apply, "second", second)
        with trio.fail_after(10):
            while b.desk._lock.statistics().tasks_waiting == 0:
                await trio.sleep(0.01)  # the second writer is at the lock
        assert len(b.writes) == 1
        slow.set()
    assert isinstance(outcome["first"], p.ConfigApplyReply)
    assert isinstance(outcome["second"], ControlError)
    assert outcome["second"].code == "stale_config"
    assert b.models_text() == first and len(b.writes) == 1


async def test_a_full_disk_leaves_files_running_config_and_history(tmp_path: Path) -> None:
    def full(changes: Sequence[FileChange]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", changes[0].path)

    b = make(tmp_path, full)
    await b.desk.record_start()
    before, running = b.models_text(), b.desk.running
    got = await b.desk.get(None)
    text = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    with pytest.raises(ControlError) as info:
        await b.desk.apply(None, text, got.version, ALICE)
    assert info.value.code == "write_failed"
    assert f"cannot write {b.models}: No space left on device" in info.value.message
    assert "nothing was changed" in info.value.message
    assert (b.models_text(), b.desk.running, b.pool.engines["a"].spec.ttl) == (before, running, 0)
    assert [v.seq for v in b.desk.history.infos()] == [1]
    assert sorted(os.listdir(tmp_path / "state" / "config-history")) == ["000001.json"]


async def test_a_load_begun_while_the_files_were_written_puts_them_back(tmp_path: Path) -> None:
    benches: list[Bench] = []

    def write(changes: Sequence[FileChange]) -> None:
        configfiles.write_files(changes)
        b = benches[0]
        if len(b.writes) == 1:  # the load begins now, between the plan and the install
            b.pool.engines["a"].state = S.STARTING

    b = make(tmp_path, write)
    benches.append(b)
    got = await b.desk.get(None)
    before = b.models_text()
    text = configtext.set_fields(got.models_text or "", "a", {"kt.ctx": 4096})
    b.pool.engines["a"].state = S.READY
    with pytest.raises(ControlError) as info:
        await b.desk.apply(None, text, got.version, ALICE)
    assert info.value.code == "busy"
    assert "a is loading" in info.value.message
    assert b.models_text() == before and b.pool.engines["a"].spec.ctx == 0


async def test_a_hand_edit_seen_at_reload_becomes_a_version(tmp_path: Path) -> None:
    b = make(tmp_path)
    await b.desk.record_start()
    doc = json.loads(b.models_text())
    doc[0]["ttl"] = 99
    b.models.write_text(json.dumps(doc, indent=2))
    summary = await b.desk.reload(Who(uid=0))
    assert "updated in place: a" in summary
    latest = b.desk.history.infos()[0]
    assert (latest.seq, latest.how, latest.uid) == (2, "reload", 0)
    assert await b.desk.reload(Who(uid=0)) == "no changes"
    assert len(b.desk.history.infos()) == 2  # the same files: no new version


async def test_rollback_goes_back_through_the_same_path(tmp_path: Path) -> None:
    b = make(tmp_path)
    await b.desk.record_start()
    start = b.models_text()
    got = await b.desk.get(None)
    text = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    applied = await b.desk.apply(None, text, got.version, ALICE)
    plan = await b.desk.rollback(None, "", ALICE, dry_run=True)
    assert isinstance(plan, p.ConfigPlanReply)
    assert [(e.alias, e.action) for e in plan.plan.engines if e.action != "unchanged"] == [
        ("a", "update")
    ]
    assert b.models_text() == text  # a dry run changed nothing
    back = await b.desk.rollback(None, applied.version, ALICE, dry_run=False)
    assert isinstance(back, p.ConfigApplyReply)
    assert b.models_text() == start and b.pool.engines["a"].spec.ttl == 0
    v = b.desk.history.infos()[0]
    assert (v.how, v.rollback_of, v.version) == ("rollback", 1, b.desk.history.infos()[2].version)
    with pytest.raises(ControlError, match=r"no version 9 in the config history \(kept: 1-3\)"):
        await b.desk.rollback(9, "", ALICE, dry_run=True)


async def test_a_change_without_a_base_is_refused_not_written_over(tmp_path: Path) -> None:
    """``base: ""`` (the protocol's default, a client that left it out) would overwrite
    whatever changed since the client read the files: refused, nothing written (issue
    43, item 7); a rollback's dry run needs none."""
    b = make(tmp_path)
    await b.desk.record_start()
    owner = Who(uid=os.getuid(), claimed="owner")
    got = await b.desk.get(None)
    text = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    with pytest.raises(ControlError) as info:
        await b.desk.apply(None, text, "", owner)
    assert info.value.code == p.ErrorCode.BAD_REQUEST and "base is required" in info.value.message
    assert info.value.detail == {"field": "base", "version": got.version}
    assert b.models_text() == got.models_text and b.writes == []
    await b.desk.apply(None, text, got.version, owner)
    with pytest.raises(ControlError) as info:
        await b.desk.rollback(None, "", owner, dry_run=False)
    assert info.value.code == p.ErrorCode.BAD_REQUEST
    assert b.models_text() == text and len(b.writes) == 1
    assert isinstance(await b.desk.rollback(None, "", owner, dry_run=True), p.ConfigPlanReply)


async def test_the_history_keeps_the_newest(tmp_path: Path) -> None:
    b = make(tmp_path, config_history=2)  # the files now and 2 before them
    await b.desk.record_start()
    for ttl in (1, 2, 3, 4):
        got = await b.desk.get(None)
        text = configtext.set_fields(got.models_text or "", "a", {"ttl": ttl})
        await b.desk.apply(None, text, got.version, ALICE)
    assert [v.seq for v in b.desk.history.infos()] == [5, 4, 3]
    assert sorted(os.listdir(tmp_path / "state" / "config-history")) == [
        "000003.json",
        "000004.json",
        "000005.json",
    ]


async def test_a_broken_file_on_disk_can_be_fixed_by_an_apply(tmp_path: Path) -> None:
    b = make(tmp_path)
    good = b.models_text()
    b.models.write_text("[{broken")
    got = await b.desk.get(None)
    assert got.models_text == "[{broken"
    plan = await b.desk.plan(None, "[{broken", "")
    assert not plan.ok and plan.problems[0].file == str(b.models)
    await b.desk.apply(None, good, got.version, ALICE)
    assert b.models_text() == good


def test_history_sets_a_corrupt_version_aside(tmp_path: Path) -> None:
    folder = tmp_path / "h"
    folder.mkdir()
    (folder / "000001.json").write_text("{not json")
    history = History(folder, 5)
    assert history.infos() == []
    assert [n.startswith("000001.json.corrupt-") for n in os.listdir(folder)] == [True]


async def test_a_rollback_after_a_start_at_another_path_writes_the_file_ktd_runs_from(
    tmp_path: Path,
) -> None:
    """Issue 43, item 6: versions made at path A, ktd started again with ``--config`` at
    path B (the same state dir): a rollback puts the old texts in B's files, and the
    desk keeps running from B (it followed A, and edits of B reloaded as no change)."""
    a = make(tmp_path / "a")
    await a.desk.record_start()
    got = await a.desk.get(None)
    text = configtext.set_fields(got.models_text or "", "a", {"ttl": 30})
    await a.desk.apply(None, text, got.version, ALICE)
    etc_b = tmp_path / "b" / "etc"
    etc_b.mkdir(parents=True)
    for name in ("config.json", "models.json"):
        (etc_b / name).write_bytes((a.config.parent / name).read_bytes())
    texts = read_config_texts(etc_b / "config.json")
    config = parse_config(texts)
    desk = ConfigDesk(config, texts, a.pool, install=a.pool.apply_config, history=a.desk.history)
    await desk.record_start()  # version 3: the files at B
    a_files = a.models.read_bytes()
    # The default target: version 2 has B's texts (at A): no change; version 1 it is.
    await desk.rollback(None, (await desk.get(None)).version, ALICE, dry_run=False)
    assert a.models.read_bytes() == a_files  # A is left as it was
    assert json.loads((etc_b / "models.json").read_text())[0].get("ttl", 0) == 0
    assert desk.path == str(etc_b / "config.json")
    assert (await desk.get(None)).config_path == str(etc_b / "config.json")
    v = desk.history.infos()[0]
    assert (v.how, v.rollback_of) == ("rollback", 1)
    doc = json.loads((etc_b / "models.json").read_text())
    doc[0]["ttl"] = 77
    (etc_b / "models.json").write_text(json.dumps(doc))
    assert "updated in place: a" in await desk.reload(Who(uid=0))
    assert a.pool.engines["a"].spec.ttl == 77


async def test_a_plan_of_texts_nested_too_deeply_is_a_config_error_naming_the_file(
    tmp_path: Path,
) -> None:
    """Issue 43: a ``config_plan`` text of 1,000 nested arrays answered ``internal`` (a
    RecursionError); it is the text's problem, named with its file, as bad JSON is."""
    b = make(tmp_path)
    deep = "[" * 1000 + "]" * 1000
    for config, models, file in (
        ('{"daemon": ' + deep + "}", None, b.config),
        (None, '[{"alias": "a", "x": ' + deep + "}]", b.models),
    ):
        plan = await b.desk.plan(config, models, "")
        assert not plan.ok, plan
        (problem,) = plan.problems
        assert problem.file == str(file)
        assert "nested more than 128 levels deep" in problem.message


async def test_a_history_file_that_contradicts_itself_is_set_aside_never_listed(
    tmp_path: Path,
) -> None:
    """Issue 43, item 8: a file whose name disagrees with its seq was listed under its seq
    and then not found by it ("no version 500 ... kept: 1-500"). A file is a version only
    if its name is its seq's and its version its texts': others are set aside at start,
    or when a read finds them changed since, and the history says what it really keeps."""
    b = make(tmp_path)
    await b.desk.record_start()
    for ttl in (1, 2, 3):
        got = await b.desk.get(None)
        text = configtext.set_fields(got.models_text or "", "a", {"ttl": ttl})
        await b.desk.apply(None, text, got.version, ALICE)
    folder = tmp_path / "state" / "config-history"
    renamed = json.loads((folder / "000002.json").read_text())
    renamed["info"]["seq"] = 500  # a hand edit, or a copy under another name
    (folder / "000002.json").write_text(json.dumps(renamed))
    edited = json.loads((folder / "000004.json").read_text())
    edited["models_text"] += " "  # its texts are no longer the version it names
    (folder / "000004.json").write_text(json.dumps(edited))

    desk = make(tmp_path).desk  # a restarted daemon reads the history
    assert [v.seq for v in desk.history.infos()] == [3, 1]
    kept = sorted(n.split(".corrupt-")[0] for n in os.listdir(folder) if ".corrupt-" in n)
    assert kept == ["000002.json", "000004.json"]
    for seq in (500, 2, 4):
        with pytest.raises(ControlError, match=rf"no version {seq} .*\(kept: 1, 3\)$"):
            await desk.get(seq)
    assert (await desk.get(3)).seq == 3  # what it lists, it gives

    # Changed after the start: found out by the read, said, and no longer listed.
    moved = json.loads((folder / "000003.json").read_text())
    moved["info"]["seq"] = 9
    (folder / "000003.json").write_text(json.dumps(moved))
    with pytest.raises(ControlError, match=r"no version 3 .*\(kept: 1\)$"):
        await desk.rollback(3, "", ALICE, dry_run=True)
    assert [v.seq for v in (await desk.history_now()).versions] == [1]
    # The next version takes a number no file had: none set aside is taken again.
    got = await desk.get(None)
    reply = await desk.apply(None, (got.models_text or "") + "\n", got.version, ALICE)
    assert reply.seq == 5 and [v.seq for v in desk.history.infos()] == [5, 1]


def test_the_kept_versions_show_their_gaps() -> None:
    from ktd.daemon.config.history import seq_ranges

    assert seq_ranges([]) == "none"
    assert seq_ranges([3, 1, 2]) == "1-3"
    assert seq_ranges([1, 3, 4, 5, 9]) == "1, 3-5, 9"
