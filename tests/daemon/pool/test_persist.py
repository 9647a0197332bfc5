"""The persister in-process: the state file's records of real ``Engine`` records, and the
adoption of real marked processes (children of the test, each killed at the end) into
them. No daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ktd.core import states as S
from ktd.core.claimsync import FrontendProcess
from ktd.core.command import DIGEST_MARK, ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.engine.engine import Engine, Running
from ktd.daemon.pool import statefile
from ktd.daemon.pool.persist import Persister
from tests.daemon.inprocess import Daemon, move


@pytest.fixture
def marked(tmp_path: Path) -> Iterator[Any]:
    """Start a process carrying an engine marker (a stand-in engine left by a daemon)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(engine_id: str, digest: str = "") -> subprocess.Popen[bytes]:
        env = {**os.environ, ENGINE_MARK: engine_id}
        if digest:
            env[DIGEST_MARK] = digest
        with open(tmp_path / f"out-{len(procs)}.log", "ab") as out:  # stdout: a log file
            proc = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)", "--port", "4321"],
                env=env,
                stdout=out,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def persister(d: Daemon, state_path: Path | None, restored: list[Any]) -> Persister:
    return Persister(
        d.host.engines,
        state_path=state_path,
        instance=d.host.instance,
        restore_claims=lambda e, claims: restored.append((e.alias, list(claims))),
    )


def record(proc: subprocess.Popen[bytes], alias: str, engine_id: str, **kw: Any) -> Any:
    info = proctree.read_stat(proc.pid)
    assert info is not None
    return statefile.EngineRecord(
        alias=alias, pid=proc.pid, start=info.start, engine_id=engine_id, port=4321, argv=[], **kw
    )


async def test_the_snapshot_holds_running_engines_with_their_claims(daemon: Any) -> None:
    d = daemon()
    up, off = d.engine("up"), d.engine("off")
    run = Running(digest="x", pid=11, start=7, engine_id="test/up@1", port=4321, argv=["a"])
    up.run = run
    move(up, S.READY, want_up=True)
    d.claims.holders["fe-1"] = FrontendProcess(pid=4242, start=99)  # its process, from the socket
    d.claims.grant(up, "fe-1")
    d.claims.grant(up, "fe-2")  # one whose process the socket did not show
    state = persister(d, None, []).snapshot()
    [rec] = state.engines
    assert (rec.alias, rec.pid, rec.port, rec.state, rec.digest) == ("up", 11, 4321, "ready", "x")
    assert sorted((c.client, c.pid, c.start) for c in rec.claims) == [
        ("fe-1", 4242, 99),
        ("fe-2", 0, 0),
    ]
    assert off.alias not in [r.alias for r in state.engines]


async def test_adoption_takes_over_recorded_engines_and_kills_strays(
    daemon: Any, marked: Any, tmp_path: Path
) -> None:
    d = daemon()
    kept, changed = d.engine("kept"), d.engine("changed", ctx=8192)
    p_kept = marked("test/kept@1", kept.spec.launch_digest())
    p_changed = marked("test/changed@1", "an older launch")
    p_stray = marked("test/unknown@1")  # no such model any more
    state_path = tmp_path / "engines.json"
    statefile.write(
        state_path,
        statefile.StateFile(
            engines=[
                record(
                    p_kept,
                    "kept",
                    "test/kept@1",
                    digest=kept.spec.launch_digest(),
                    claims=[
                        statefile.ClaimRecord(id="c1", client="fe-1"),
                        statefile.ClaimRecord(id="c2", client="fe-2", pid=4242, start=99),
                    ],
                ),
                record(p_changed, "changed", "test/changed@1", digest="an older launch"),
            ]
        ),
    )
    restored: list[Any] = []
    per = persister(d, state_path, restored)
    adopted, killed = per.adopt()
    assert sorted(adopted) == ["changed", "kept"]
    assert killed == [p_stray.pid] and p_stray.wait(10) is not None
    assert isinstance(kept.adopt, Running) and kept.adopt.pid == p_kept.pid
    assert restored == [("kept", [("c1", "fe-1", None), ("c2", "fe-2", FrontendProcess(4242, 99))])]
    # Started with another launch while no ktd watched: restarted when idle, as a reload.
    assert per.restart_later == [changed] and changed.stale
    assert not kept.stale


async def test_no_state_file_recovers_what_the_process_says(daemon: Any, marked: Any) -> None:
    d = daemon()
    e: Engine = d.engine("m")
    proc = marked("test/m@5", e.spec.launch_digest())
    adopted, killed = persister(d, None, []).adopt()
    assert adopted == ["m"] and killed == []
    run = e.adopt
    assert run is not None and run.pid == proc.pid and run.port == 4321
    assert run.adopted_state is None  # unknown: a fresh health_timeout to answer
