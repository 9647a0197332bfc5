"""Injected faults, end to end: real ``ktd serve``, sim engines, real signals and file systems.

Each test says in its docstring what an operator sees, and ends by checking that
no engine process and no engine port is left (on top of the autouse leak check).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.pool import statefile
from tests.conftest import ConfigWriter, engine_auth, sim_model

from ._util import (
    FAST_DAEMON,
    alive,
    engine_procs,
    kill_group,
    listening_ports,
    session_of,
    wait_for,
)


def assert_clean(*ports: int | None) -> None:
    """No engine process of this run, and none of ``ports`` still listening."""
    wait_for(lambda: not engine_procs(), timeout=10, what="engine processes to be gone")
    held = {p for p in ports if p} & listening_ports()
    assert not held, f"ports still listening: {held}"


def ready_with_new_pid(c: Any, alias: str, old_pid: int) -> Any:
    def check() -> Any:
        [e] = c.status(alias)
        return e if e.state == "ready" and e.pid not in (None, old_pid) else None

    return check


def settled_after(c: Any, alias: str, old_pid: int | None) -> Any:
    """Ready on another pid, or failed: what a crash leads to, whichever it is."""

    def check() -> Any:
        [e] = c.status(alias)
        return e if e.state in ("ready", "failed") and e.pid != old_pid else None

    return check


def state_is(c: Any, alias: str, *states: str) -> Any:
    def check() -> Any:
        [e] = c.status(alias)
        return e if e.state in states else None

    return check


def log_text(d: Any, alias: str) -> str:
    return (Path(d.env["KTD_STATE_DIR"]) / "logs" / f"{alias}.log").read_text(errors="replace")


# ---------------------------------------------------------------- engine crashes


@pytest.mark.parametrize("victim", ["group", "scheduler"])
def test_engine_killed_while_ready_is_restarted(
    write_config: ConfigWriter, daemon_factory: Any, victim: str
) -> None:
    """User sees: after ``kill -9 -<pgid>`` of a ready engine (or the OOM killer taking just
    its scheduler child, after which SGLang's server exits 1), ``ktctl status`` shows it
    ``starting`` (reason "engine was killed by SIGKILL while ready" / "exited with code 1")
    and shortly ``ready`` again on a new pid with ``restarts: 1``; nobody had to run
    ``ktctl load``. The old process tree is gone and the log says why it restarted."""
    d = daemon_factory(write_config([sim_model("crash-kt")], daemon=FAST_DAEMON))
    with d.client(timeout=60) as c:
        first = c.load("crash-kt")
        old_tree = session_of(first.pid)
        children = old_tree - {first.pid}
        assert children  # the sim's scheduler
        if victim == "group":
            kill_group(first.pid)
        else:
            os.kill(min(children), signal.SIGKILL)
        again = wait_for(ready_with_new_pid(c, "crash-kt", first.pid), what="restart")
        assert again.restarts == 1
        assert not any(alive(pid) for pid in old_tree)
        assert set(engine_procs()) <= session_of(again.pid)
        why = (
            "killed by SIGKILL while ready"
            if victim == "group"
            else "exited with code 1 while ready"
        )
        assert f"{why}; restarting" in "\n".join(c.logs("crash-kt", 200))
        c.evict("crash-kt")
    assert_clean(first.port, again.port)


def test_engine_killed_with_restart_no_ends_failed(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: with ``"restart": "no"`` the killed engine stays down: ``ktctl status`` says
    ``failed`` with the reason "engine was killed by SIGKILL while ready" and the log tail;
    ``ktctl load`` starts it again."""
    d = daemon_factory(write_config([sim_model("once-kt", restart="no")], daemon=FAST_DAEMON))
    with d.client(timeout=60) as c:
        first = c.load("once-kt")
        kill_group(first.pid)
        failed = wait_for(state_is(c, "once-kt", "failed"), what="failed")
        assert failed.reason == "engine was killed by SIGKILL while ready"
        assert failed.pid is None and failed.restarts == 0 and failed.log_tail
        assert_clean(first.port)
        time.sleep(0.5)  # and it stays down
        assert c.status("once-kt")[0].state == "failed" and not engine_procs()
        second = c.load("once-kt")
        assert second.state == "ready" and second.pid != first.pid
        c.evict("once-kt")
    assert_clean(second.port)


def test_engine_that_keeps_crashing_ends_failed_as_flapping(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: an engine that dies every time it becomes ready is restarted
    ``restart_max`` times and then ``ktctl status`` shows ``failed`` with a reason starting
    "flapping: 3 crashes within 60s"; it is not restarted forever."""
    daemon = {**FAST_DAEMON, "restart_max": 2, "restart_window": 60}
    d = daemon_factory(write_config([sim_model("flap-kt")], daemon=daemon))
    kills = 0
    pids: list[int] = []
    with d.client(timeout=60) as c:
        c.load("flap-kt")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            [e] = c.status("flap-kt")
            if e.state == "failed":
                break
            if e.state == "ready" and e.pid not in pids:
                pids.append(e.pid)
                kill_group(e.pid)  # "crashes right after becoming ready"
                kills += 1
            time.sleep(0.02)
        [e] = c.status("flap-kt")
        assert e.state == "failed", e
        assert e.reason and e.reason.startswith("flapping: 3 crashes within 60s"), e.reason
        assert kills == 3 and e.restarts == 2
        time.sleep(1.0)
        [still] = c.status("flap-kt")
        assert still.state == "failed" and still.pid is None and still.restarts == 2
    assert_clean()


def test_explicit_load_after_flapping_gets_a_fresh_restart_budget(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: after fixing a flapping engine, ``ktctl load`` brings it back and one
    crash later it is restarted again, not failed at once for crashes of the old attempt."""
    daemon = {**FAST_DAEMON, "restart_max": 1, "restart_window": 60}
    d = daemon_factory(write_config([sim_model("budget-kt")], daemon=daemon))
    with d.client(timeout=60) as c:
        e = c.load("budget-kt")
        for _ in range(2):
            kill_group(e.pid)
            e = wait_for(settled_after(c, "budget-kt", e.pid), what="restart or failure")
        assert e.state == "failed" and "flapping" in (e.reason or "")
        e = c.load("budget-kt")
        kill_group(e.pid)
        again = wait_for(settled_after(c, "budget-kt", e.pid), what="restart after a load")
        assert again.state == "ready", again.reason
        c.evict("budget-kt")
    assert_clean()


# ---------------------------------------------------------------- hangs


def test_hung_engine_is_killed_and_restarted(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: an engine that stops answering (SIGUSR1 makes the sim hang, as a GPU
    lock-up would) is killed after ``hang_timeout`` and comes back ``ready`` on a new pid;
    the log says "hung: /health did not answer 200 for 1s; killing the engine"."""
    d = daemon_factory(write_config([sim_model("hang-kt")], daemon=FAST_DAEMON))
    with d.client(timeout=60) as c:
        first = c.load("hang-kt")
        old_tree = session_of(first.pid)
        os.kill(first.pid, signal.SIGUSR1)
        t0 = time.monotonic()
        again = wait_for(ready_with_new_pid(c, "hang-kt", first.pid), what="hang restart")
        assert time.monotonic() - t0 < 10
        assert again.restarts == 1
        assert not any(alive(pid) for pid in old_tree)
        log = "\n".join(c.logs("hang-kt", 300))
        assert "hung: /health did not answer 200 for 1s; killing the engine" in log
        c.evict("hang-kt")
    assert_clean(first.port, again.port)


def test_engine_that_always_hangs_ends_failed(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: an engine that hangs shortly after every start (``KTD_SIM_HANG_AFTER``) is
    restarted once (``restart_max`` 1) and then shown ``failed`` as flapping, the last reason
    being the hang; every hung tree was killed."""
    daemon = {**FAST_DAEMON, "restart_max": 1, "restart_window": 60}
    model = sim_model("hang2-kt", env={"KTD_SIM_HANG_AFTER": "0.3"})
    d = daemon_factory(write_config([model], daemon=daemon))
    with d.client(timeout=60) as c:
        c.load("hang2-kt")
        e = wait_for(state_is(c, "hang2-kt", "failed"), timeout=30, what="failed")
        assert e.reason and e.reason.startswith("flapping: 2 crashes"), e.reason
        assert "hung: /health did not answer" in e.reason
        assert e.restarts == 1
    assert_clean()


# ---------------------------------------------------------------- daemon death and adoption


def test_daemon_sigkill_then_restart_adopts_running_engines(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    """User sees: ``kill -9`` of ktd does not touch the engines; the next ``ktd serve``
    shows them ``ready`` again within a second or two with the SAME pids and ports (no
    reload of a 600 GB model), and ``ktctl evict`` (forced or not) still tears each one
    down completely, a grandchild that left the engine's session included."""
    rec = {a: tmp_path / f"{a}.json" for a in ("ad-a", "ad-b")}
    models = [
        sim_model("ad-a", record=rec["ad-a"]),
        sim_model("ad-b", record=rec["ad-b"], env={"KTD_SIM_ESCAPE": "1"}),
    ]
    cfg = write_config(models, daemon=FAST_DAEMON)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        before = {a: c.load(a) for a in rec}
    trees = {a: session_of(e.pid) for a, e in before.items()}
    assert d1.stop(signal.SIGKILL) == -signal.SIGKILL
    time.sleep(0.3)
    for a, e in before.items():
        assert all(alive(pid) for pid in trees[a]), f"{a}'s tree died with the daemon"
        assert e.port in listening_ports()
    escaped = [
        p for p, mark in engine_procs().items() if "/ad-b@" in mark and p not in trees["ad-b"]
    ]
    assert escaped, "the sim's escaped grandchild should be running"

    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        for a, e in before.items():
            now = wait_for(state_is(c, a, "ready"), timeout=10, what=f"{a} adopted")
            assert (now.pid, now.port, now.restarts) == (e.pid, e.port, 0)
            # The sim writes its record once per start: same pid = never restarted.
            assert json.loads(rec[a].read_text())["pid"] == e.pid
            assert log_text(d2, a).count("[ktd] starting:") == 1
        assert "re-adopted running engine(s): ad-a, ad-b" in d2.output()
        # Forced: no waiting for the exit through the pidfd (this once crashed the daemon).
        r = d2.ktctl("evict", "--force", "ad-a")
        assert r.returncode == 0, r.stderr + d2.output()
        assert not any(alive(pid) for pid in trees["ad-a"])
        assert before["ad-a"].port not in listening_ports()
        assert all(alive(pid) for pid in trees["ad-b"])
        r = d2.ktctl("evict", "--all")
        assert r.returncode == 0, r.stderr
        assert not any(alive(pid) for pid in escaped)
        assert d2.ktctl("ping").returncode == 0
    assert not any(alive(pid) for tree in trees.values() for pid in tree)
    assert_clean(*(e.port for e in before.values()))


def _spawn_sleeper(*, env: dict[str, str] | None = None, argv0: str | None = None) -> Any:
    """A harmless long-lived process (the test reaps it)."""
    cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
    if argv0:
        cmd.append(argv0)
    return subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_state_file_with_dead_or_recycled_pids_is_not_adopted(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """User sees: a stale ``engines.json`` (the engine died while ktd was down, or its pid
    now belongs to another program) is ignored: ``ktctl status`` shows the engines
    ``stopped``, the unrelated program that got the pid is left alone, and ``ktctl load``
    starts fresh engines."""
    state_dir = Path(ktd_env["KTD_STATE_DIR"])
    instance = statefile.instance_key(state_dir)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    bystander = _spawn_sleeper()  # a live pid with another program's cmdline
    twin = _spawn_sleeper(argv0="twin")  # same cmdline as recorded, other start time
    try:
        wait_for(lambda: proctree.cmdline(twin.pid)[-1:] == ["twin"], what="twin up")
        b_info = proctree.read_stat(bystander.pid)
        t_info = proctree.read_stat(twin.pid)
        assert b_info and t_info
        fake_argv = [sys.executable, "-m", "sglang.launch_server", "--port", "1"]
        records = [
            statefile.EngineRecord(
                alias="st-a",
                pid=gone.pid,
                start=1,
                engine_id=f"{instance}/st-a@1",
                port=1,
                argv=fake_argv,
            ),
            statefile.EngineRecord(
                alias="st-b",
                pid=bystander.pid,
                start=b_info.start,
                engine_id=f"{instance}/st-b@1",
                port=1,
                argv=fake_argv,
            ),
            statefile.EngineRecord(
                alias="st-c",
                pid=twin.pid,
                start=t_info.start + 1,
                engine_id=f"{instance}/st-c@1",
                port=1,
                argv=proctree.cmdline(twin.pid),
            ),
        ]
        statefile.write(state_dir / "engines.json", statefile.StateFile(engines=records))
        cfg = write_config([sim_model(a) for a in ("st-a", "st-b", "st-c")], daemon=FAST_DAEMON)
        d = daemon_factory(cfg)
        with d.client(timeout=60) as c:
            for e in c.status():
                assert (e.state, e.pid) == ("stopped", None), e
            assert "re-adopted" not in d.output()
            assert alive(bystander.pid) and alive(twin.pid)
            loaded = c.load("st-b")
            assert loaded.state == "ready" and loaded.pid not in (bystander.pid, twin.pid)
            c.evict("st-b")
        assert alive(bystander.pid) and alive(twin.pid)
    finally:
        for proc in (bystander, twin):
            proc.kill()
            proc.wait()
    assert_clean()


def test_stray_marked_engine_is_killed_at_startup(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """User sees: a process carrying this ktd instance's engine marker that no record
    names and that cannot be supervised (no ``--port``: not an engine command line) is
    killed when ktd starts (the log says "killed 1 stray engine process(es)"), so it
    cannot hold a GPU unseen; engines of another ktd instance (another state dir) are not
    touched. (An unrecorded marked *engine* is re-adopted instead: test_hardening.)"""
    instance = statefile.instance_key(Path(ktd_env["KTD_STATE_DIR"]))
    env_ours = {**os.environ, ENGINE_MARK: f"{instance}/ghost-kt@123"}
    env_theirs = {**os.environ, ENGINE_MARK: "0123456789ab/ghost-kt@123"}
    ours = _spawn_sleeper(env=env_ours)
    theirs = _spawn_sleeper(env=env_theirs)
    try:
        wait_for(lambda: proctree.environ_has(ours.pid, ENGINE_MARK), what="ghost up")
        d = daemon_factory(write_config([sim_model("ghost-kt")], daemon=FAST_DAEMON))
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert "killed 1 stray engine process(es)" in d.output()
        assert theirs.poll() is None
        with d.client() as c:
            assert c.status("ghost-kt")[0].state == "stopped"
    finally:
        for proc in (ours, theirs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert_clean()


@pytest.mark.parametrize("keep", [True, False], ids=["keep_engines_on_exit", "default"])
def test_sigterm_with_and_without_keep_engines_on_exit(
    write_config: ConfigWriter, daemon_factory: Any, keep: bool
) -> None:
    """User sees: with ``daemon.keep_engines_on_exit: true``, ``systemctl stop ktd`` (SIGTERM)
    leaves the engines serving and the next ktd adopts them (same pids, ready at once);
    without it, SIGTERM drains and stops every engine and ktd exits 0 leaving nothing."""
    daemon = {**FAST_DAEMON, "keep_engines_on_exit": keep}
    cfg = write_config([sim_model("k-a"), sim_model("k-b")], daemon=daemon)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        before = {a: c.load(a) for a in ("k-a", "k-b")}
    assert d1.stop(signal.SIGTERM) == 0
    if not keep:
        assert not engine_procs()
        assert_clean(*(e.port for e in before.values()))
        return
    assert all(alive(e.pid) for e in before.values())
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        for a, e in before.items():
            now = wait_for(state_is(c, a, "ready"), timeout=10, what=f"{a} adopted")
            assert (now.pid, now.port) == (e.pid, e.port)
        assert c.evict(all=True) == ["k-a", "k-b"]
    assert_clean(*(e.port for e in before.values()))


def test_engine_ignoring_sigterm_is_killed_after_stop_grace(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: ``ktctl evict`` of an engine that ignores SIGTERM returns after
    ``daemon.stop_grace`` (1 s here), the log says "SIGKILL to N process(es) left after 1s",
    and nothing of it remains; ktd's own shutdown does the same and exits 0."""
    model = sim_model("deaf-kt", env={"KTD_SIM_IGNORE_SIGTERM": "1"})
    d = daemon_factory(write_config([model], daemon={**FAST_DAEMON, "stop_grace": 1}))
    with d.client(timeout=60) as c:
        first = c.load("deaf-kt")
        t0 = time.monotonic()
        c.evict("deaf-kt")
        took = time.monotonic() - t0
        assert 0.9 <= took < 5, took
        assert "left after 1s" in "\n".join(c.logs("deaf-kt", 100))
        assert_clean(first.port)
        second = c.load("deaf-kt")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 8
    assert_clean(second.port)


def test_daemon_killed_during_a_load_adopts_the_loading_engine(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: ktd dies (``kill -9``) while a model is still loading; the next ktd shows
    it ``starting`` ("adopting") and then ``ready`` on the same pid: the load goes on, it
    does not start over."""
    model = sim_model("slow-kt", env={"KTD_SIM_LOAD_TIME": "2.0"})
    cfg = write_config([model], daemon=FAST_DAEMON)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        c.load("slow-kt", wait=False)
        loading = wait_for(
            lambda: c.status("slow-kt")[0].pid and c.status("slow-kt")[0], what="spawn"
        )
        d1.wait_recorded("slow-kt", loading.pid)  # what the next ktd adopts from
    d1.stop(signal.SIGKILL)
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        now = wait_for(state_is(c, "slow-kt", "ready"), timeout=15, what="ready")
        assert (now.pid, now.port) == (loading.pid, loading.port)
        assert log_text(d2, "slow-kt").count("[ktd] starting:") == 1
        c.evict("slow-kt")
    assert_clean(loading.port)


# ---------------------------------------------------------------- leases


def test_lease_of_a_client_that_dies_after_a_long_autoload_expires(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: a frontend (or tool) that acquires a model which first has to load for
    longer than ``lease_ttl``, and then dies without ever sending a heartbeat, does not pin
    the engine: its lease is gone ``lease_ttl`` later and ``ktctl status`` shows 0 in flight.
    (Before the fix the sweeper forgot the client during the load and the lease never
    expired.)"""
    model = sim_model("al-kt", env={"KTD_SIM_LOAD_TIME": "2.5"})
    d = daemon_factory(write_config([model], daemon={**FAST_DAEMON, "lease_ttl": 1.0}))
    with d.client(timeout=60) as c:
        got = c.acquire("al-kt", "dies-after-acquire")
        assert c.status("al-kt")[0].in_flight == 1
        # ... and the client is gone: no heartbeat, no release.
        wait_for(lambda: c.status("al-kt")[0].in_flight == 0, timeout=4, what="lease expiry")
        c.release(got.lease)  # late release of an expired lease: harmless
        c.evict("al-kt")
    assert_clean()


# ---------------------------------------------------------------- log files


def test_unwritable_log_dir_still_loads_and_shows_the_tail(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    """User sees: with ``daemon.log_dir`` unusable (here a path under a regular file), the
    engine still loads; ``ktctl logs`` shows the engine's own lines (from the in-memory
    tail) and a line naming the log file and why it cannot be written."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file\n")
    log_dir = blocker / "logs"
    cfg = write_config([sim_model("nolog-kt")], daemon={**FAST_DAEMON, "log_dir": str(log_dir)})
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        e = c.load("nolog-kt", timeout=30)
        assert e.state == "ready"
        r = d.ktctl("logs", "nolog-kt", "-n", "200")
        assert r.returncode == 0, r.stderr
        assert f"log file {log_dir / 'nolog-kt.log'}: Not a directory" in r.stdout
        assert "The server is fired up and ready to roll!" in r.stdout
        # Still ready a while later: its output is drained, nothing blocks on a full pipe.
        url = f"http://127.0.0.1:{e.port}"
        with httpx.Client(trust_env=False, timeout=5, headers=engine_auth(e.port)) as http:
            for _ in range(300):  # ~100 bytes of access log each: more than a pipe buffer
                assert http.get(f"{url}/v1/models").status_code == 200
        [again] = c.status("nolog-kt")
        assert again.state == "ready" and again.pid == e.pid
        assert any("GET /v1/models" in ln for ln in c.logs("nolog-kt", 50))
        c.evict("nolog-kt")
    assert_clean(e.port)


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="ktd-full-", dir="/tmp"))
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        mnt.rmdir()
        pytest.skip("no mount(8) here: cannot make a small file system to fill")
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(
            f"cannot mount a {size} tmpfs here (need root/CAP_SYS_ADMIN): {r.stderr.strip()}"
        )
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        mnt.rmdir()


def test_log_disk_full_keeps_engine_and_daemon_up(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User sees: when the log file system fills up (a 64 KiB tmpfs here, filled by the
    engine's own access log under load), the engine stays ``ready`` on the same pid and
    serves, ktd keeps answering, ``ktctl logs`` still answers, and ``ktctl evict`` works."""
    with small_tmpfs("64k") as mnt:
        cfg = write_config([sim_model("full-kt")], daemon={**FAST_DAEMON, "log_dir": str(mnt)})
        d = daemon_factory(cfg)
        with d.client(timeout=60) as c:
            e = c.load("full-kt")
            url = f"http://127.0.0.1:{e.port}"
            with httpx.Client(trust_env=False, timeout=5, headers=engine_auth(e.port)) as http:
                for _ in range(1500):  # ~100 bytes each: well past 64 KiB
                    assert http.get(f"{url}/v1/models").status_code == 200
                free = os.statvfs(mnt)
                assert free.f_bavail * free.f_frsize < 8192, "the file system did not fill"
                assert http.get(f"{url}/health").status_code == 200
            time.sleep(1.0)  # a few health checks on a full disk
            assert c.ping().pid == d.proc.pid
            [now] = c.status("full-kt")
            assert (now.state, now.pid, now.restarts) == ("ready", e.pid, 0)
            assert c.logs("full-kt", 20)
            c.evict("full-kt")
            [gone] = c.status("full-kt")
            assert gone.state == "stopped"
        d.stop()
    assert_clean(e.port)


# ---------------------------------------------------------------- known bugs (repros)
# Each is strict: when the bug is fixed the test XPASSes, fails, and the marker goes.


def test_engine_that_hung_while_ktd_was_down_is_restarted_after_adoption(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User should see: an engine that was ``ready`` when ktd died but hangs meanwhile is
    killed and restarted by the next ktd after ``hang_timeout``, like any hung engine.
    Today it shows ``starting`` ("adopting") until ``health_timeout`` and then ``failed``."""
    cfg = write_config([sim_model("hz-kt", health_timeout=30)], daemon=FAST_DAEMON)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        first = c.load("hz-kt")
    d1.stop(signal.SIGKILL)
    os.kill(first.pid, signal.SIGUSR1)  # hangs while no ktd watches it
    d2 = daemon_factory(cfg)
    try:
        with d2.client(timeout=60) as c:
            wait_for(
                ready_with_new_pid(c, "hz-kt", first.pid),
                timeout=8,
                what="the hung adopted engine to be restarted",
            )
    finally:
        with d2.client(timeout=60) as c:
            c.evict(all=True, force=True)
        assert_clean(first.port)


def test_model_readded_while_its_engine_drains_is_served(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User should see: removing a model from models.json, ``ktctl reload``, putting it back
    and reloading again (a quick undo) leaves the model served. Today, if its engine was
    still draining at the second reload, ``ktctl load`` fails (``load_failed: rm-b: None``
    while the retired engine lingers, ``unknown_model`` once it is forgotten) although the
    config lists it."""
    both = [sim_model("rm-a"), sim_model("rm-b")]
    daemon = {**FAST_DAEMON, "drain_timeout": 3}
    d = daemon_factory(write_config(both, daemon=daemon))
    with d.client(timeout=60) as c:
        c.load("rm-b")
        lease = c.acquire("rm-b", "holder").lease  # keeps it draining for drain_timeout
        write_config(both[:1], daemon=daemon)
        c.reload()
        wait_for(state_is(c, "rm-b", "draining"), what="drain")
        write_config(both, daemon=daemon)
        c.reload()
        c.release(lease)
        try:
            wait_for(lambda: not engine_procs(), what="the old engine to stop")
            assert c.load("rm-b").state == "ready"
        finally:
            c.evict(all=True, force=True)
    assert_clean()


def test_a_reload_that_restarts_a_loading_model_lets_its_waiters_ride(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """Issue 31, item 8: a reload that changed a model while it loaded failed the load
    waiting for it (``load_failed``) although the restarted engine came up a moment
    later. Now the waiter rides the restarted load, and gets the new launch."""
    import threading

    slow = {"KTD_SIM_LOAD_TIME": "1.5"}  # the reload comes while it loads
    d = daemon_factory(write_config([sim_model("rl-kt", env=slow, kt={"ctx": 4096})]))
    got: list[Any] = []

    def load() -> None:
        with d.client(timeout=60) as c2:
            try:
                got.append(c2.load("rl-kt"))
            except Exception as exc:
                got.append(exc)

    t = threading.Thread(target=load)
    with d.client(timeout=60) as c:
        t.start()
        wait_for(state_is(c, "rl-kt", "starting"), what="the load under way")
        write_config([sim_model("rl-kt", env=slow, kt={"ctx": 8192})])
        assert "restarting: rl-kt" in c.reload().message
        t.join(60)
        assert len(got) == 1 and not isinstance(got[0], Exception), got
        [e] = c.status("rl-kt")
        assert e.state == "ready" and "8192" in e.argv and not e.stale
        assert e.pid == got[0].pid  # the answer is the restarted engine
        c.evict(all=True, force=True)
    assert_clean()


def test_adopted_engine_follows_a_config_changed_while_ktd_was_down(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User should see: after editing models.json while ktd is down (here ``ctx`` 4096 ->
    8192), the next ktd adopts the running engine and then restarts it with the new
    command line once idle, as ``ktctl reload`` would (or at least flags it ``stale``).
    Today it keeps serving ``--context-length 4096`` indefinitely, with ``stale: false``."""
    daemon = FAST_DAEMON
    d1 = daemon_factory(write_config([sim_model("cfg-kt", kt={"ctx": 4096})], daemon=daemon))
    with d1.client(timeout=60) as c:
        first = c.load("cfg-kt")
    d1.stop(signal.SIGKILL)
    cfg = write_config([sim_model("cfg-kt", kt={"ctx": 8192})], daemon=daemon)
    d2 = daemon_factory(cfg)
    try:
        with d2.client(timeout=60) as c:

            def follows() -> bool:
                [e] = c.status("cfg-kt")
                return e.stale or (e.state == "ready" and "8192" in e.argv)

            wait_for(follows, timeout=8, what="the adopted engine to follow the new config")
    finally:
        with d2.client(timeout=60) as c:
            c.evict(all=True, force=True)
        assert_clean(first.port)


def test_daemon_killed_during_an_evict_finishes_the_evict_after_restart(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """User should see: ``ktctl evict`` interrupted by a ``kill -9`` of ktd (the engine was
    draining a request) is not undone: the next ktd adopts the engine and stops it."""
    import threading

    cfg = write_config([sim_model("ev-kt")], daemon={**FAST_DAEMON, "drain_timeout": 60})
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        first = c.load("ev-kt")
        c.acquire("ev-kt", "holder")

    def evict() -> None:
        with contextlib.suppress(Exception), d1.client(timeout=60) as c2:
            c2.evict("ev-kt")

    t = threading.Thread(target=evict)
    t.start()
    with d1.client() as c:
        wait_for(state_is(c, "ev-kt", "draining"), what="drain")
    d1.stop(signal.SIGKILL)
    t.join()
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        wait_for(state_is(c, "ev-kt", "stopped"), timeout=15, what="the evict to finish")
    assert_clean(first.port)
