"""Adoption decisions (pure) and the /proc scan: ownership is the marker, never a record."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.pool import adoption
from ktd.daemon.pool.statefile import EngineRecord

INST = "0123456789ab"


def found(
    alias: str, n: int, pid: int, *, start: int = 100, port: int | None = 8000
) -> adoption.Found:
    argv = ("python", "-m", "sglang.launch_server") + (("--port", str(port)) if port else ())
    return adoption.Found(
        engine_id=f"{INST}/{alias}@{n}",
        alias=alias,
        pid=pid,
        start=start,
        members=((pid, start),),
        argv=argv,
    )


def record(f: adoption.Found, **over: object) -> EngineRecord:
    fields: dict[str, object] = dict(
        alias=f.alias,
        pid=f.pid,
        start=f.start,
        engine_id=f.engine_id,
        port=8000,
        argv=list(f.argv),
    )
    fields.update(over)
    return EngineRecord(**fields)  # type: ignore[arg-type]


def test_alias_and_port_parsing() -> None:
    assert adoption.alias_of(f"{INST}/a-kt@17", INST) == "a-kt"
    assert adoption.alias_of(f"{INST}/we@ird@17", INST) == "we@ird"
    assert adoption.alias_of("ffffffffffff/a-kt@17", INST) is None
    assert adoption.alias_of(f"{INST}/a-kt", INST) is None
    assert adoption.port_of(["x", "--port", "31"]) == 31
    assert adoption.port_of(["x", "--port=32"]) == 32
    assert adoption.port_of(["x", "--port", "nope"]) is None
    assert adoption.port_of(["x", "--port", "70000"]) is None
    assert adoption.port_of(["x"]) is None
    assert adoption.numa_nodes_of(["x", "--kt-numa-nodes", "0", "1", "--y"]) == (0, 1)
    assert adoption.numa_nodes_of(["x"]) == ()
    f = adoption.Found(engine_id="e", alias="a", pid=1, start=1, members=(), gpus_env="2,3")
    assert f.gpus == (2, 3)
    assert adoption.Found(**{**f.__dict__, "gpus_env": "GPU-uuid"}).gpus == ()


def test_recorded_engine_is_adopted_with_its_record() -> None:
    f = found("a", 1, 500)
    d = adoption.decide([record(f)], {f.engine_id: f}, {"a"})
    assert d.adopt == [(f, record(f))] and not d.kill and not d.ignored


def test_engine_without_record_is_recovered_not_killed() -> None:
    """Issue 12, attack 1: a truncated or missing record must not make an engine a stray."""
    f = found("a", 1, 500)
    d = adoption.decide([], {f.engine_id: f}, {"a"})
    assert d.adopt == [(f, None)] and not d.kill


def test_record_of_a_process_without_marker_is_ignored() -> None:
    """Issue 12, attack 4: a forged record names a process no marker vouches for."""
    forged = EngineRecord(
        alias="a", pid=4242, start=7, engine_id=f"{INST}/a@9", port=1, argv=["sleep", "600"]
    )
    d = adoption.decide([forged], {}, {"a"})
    assert not d.adopt and not d.kill
    assert [r for r, _ in d.ignored] == [forged]


def test_record_must_match_the_marked_main_process() -> None:
    f = found("a", 1, 500)
    # The record points the marked engine id at another pid: the record is wrong, the
    # engine (proved by its marker) is recovered as if unrecorded.
    d = adoption.decide([record(f, pid=501)], {f.engine_id: f}, {"a"})
    assert d.adopt == [(f, None)] and len(d.ignored) == 1
    d = adoption.decide([record(f, alias="b")], {f.engine_id: f}, {"a", "b"})
    assert d.adopt == [(f, None)] and len(d.ignored) == 1


def test_unconfigured_and_duplicate_and_portless_engines_are_killed() -> None:
    gone = found("gone", 1, 500)
    old = found("a", 1, 600, start=100)
    new = found("a", 2, 700, start=200)
    portless = found("b", 1, 800, port=None)
    everything = {f.engine_id: f for f in (gone, old, new, portless)}
    d = adoption.decide([], everything, {"a", "b"})
    assert d.adopt == [(new, None)]  # the newest of two unrecorded engines for one alias
    reasons = {f.engine_id: why for f, why in d.kill}
    assert set(reasons) == {gone.engine_id, old.engine_id, portless.engine_id}
    assert "no longer configured" in reasons[gone.engine_id]
    assert "second engine" in reasons[old.engine_id]
    assert "--port" in reasons[portless.engine_id]
    # A record wins over "newest".
    d = adoption.decide([record(old)], everything, {"a", "b"})
    assert (old, record(old)) in d.adopt and new in [f for f, _ in d.kill]


def test_main_process_is_the_earliest_session_leader() -> None:
    m = adoption.Marked
    main = m(pid=10, start=5, ppid=1, sid=10, engine_id="e")
    child = m(pid=11, start=6, ppid=10, sid=10, engine_id="e")
    escaped = m(pid=12, start=7, ppid=1, sid=12, engine_id="e")  # setsid'd, orphaned
    assert adoption.main_process([escaped, child, main]) == main
    assert adoption.main_process([escaped, child]) == escaped


def test_scan_finds_marked_trees_and_kill_spares_the_unmarked() -> None:
    """A real marked process tree is found whole; ``kill`` signals only marked members."""
    eid = f"{INST}/scan-kt@{time.time_ns()}"
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)"
    )
    env = {**os.environ, ENGINE_MARK: eid}
    root = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "1234"], env=env, start_new_session=True
    )
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:

        def scanned() -> adoption.Found | None:
            f = adoption.scan(INST).get(eid)
            return f if f is not None and len(f.members) == 2 else None

        deadline = time.monotonic() + 10
        f = scanned()
        while f is None and time.monotonic() < deadline:
            time.sleep(0.02)
            f = scanned()
        assert f is not None
        assert (f.pid, f.alias, f.port) == (root.pid, "scan-kt", 1234)
        assert bystander.pid not in {pid for pid, _ in f.members}
        # A forged member (the bystander) smuggled into ``members`` is not signalled.
        info = proctree.read_stat(bystander.pid)
        assert info is not None
        forged = adoption.Found(**{**f.__dict__, "members": (*f.members, (info.pid, info.start))})
        killed = adoption.kill(forged)
        assert root.pid in killed and bystander.pid not in killed
        assert root.wait(10) == -9
        assert bystander.poll() is None
    finally:
        for proc in (root, bystander):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        left = adoption.scan(INST).get(eid)
        if left is not None:
            adoption.kill(left)
