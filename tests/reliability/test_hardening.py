"""Issue 12's attacks on the daemon, each reproduced end to end through public interfaces.

Real ``ktd serve`` processes, sim engines, real file systems (a tiny tmpfs for the
full disk), real foreign processes. Each test names the attack it reproduces and
says what an operator sees now.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from ktd import protocol as p
from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.pool import statefile
from tests.conftest import ConfigWriter, engine_auth, sim_model

from ._util import FAST_DAEMON, alive, engine_procs, session_of, wait_for
from .test_faults import assert_clean, small_tmpfs, state_is


def long_model_path(root: Path) -> str:
    """A model dir (with the config.json preflight asks for) whose path is 2,400+ chars:
    it makes a record of three engines larger than one 4 KiB page."""
    from ktd.sim.model import make_model

    model, _ = make_model(root.joinpath(*["p" * 200] * 12), "model")
    return model


def _fill(mnt: Path, leave: int = 0) -> Path:
    """Fill the file system, then free ``leave`` bytes (whole pages) again."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    break
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    if leave:
        spare = filler.stat().st_size - leave
        os.truncate(filler, max(0, spare - spare % 4096))
    return filler


def _records(path: Path) -> set[str]:
    return {r.alias for r in statefile.read(path).engines}


def _temps(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


# ---------------------------------------------------------------- attack 1: the full disk


def test_full_state_disk_never_truncates_the_record_nor_kills_at_restart(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str], tmp_path: Path
) -> None:
    """Attack 1: 4 KiB left on the state file system; the record grows past it.

    Before: ``engines.json`` became 4,096 bytes of invalid JSON, nothing was logged, a
    ``.tmp`` stayed behind, and the next ``ktd serve`` killed every engine. Now: the old
    record stays whole, the temp file is removed, the daemon log says ERROR "cannot
    write state file ... No space left on device"; after ``kill -9`` the next ktd
    adopts all three engines (the unrecorded one by its marker: "recovered engine ...
    without a state record"), kills none, and writes the full record once space is back.
    """
    with small_tmpfs("512k") as mnt:
        env = {**ktd_env, "KTD_STATE_DIR": str(mnt / "state")}
        aliases = ["fd-a", "fd-b", "fd-c"]
        long_path = long_model_path(tmp_path)
        models = [sim_model(a, path=long_path) for a in aliases]
        cfg = write_config(models, daemon={**FAST_DAEMON, "log_dir": str(tmp_path / "logs")})
        state = mnt / "state" / "engines.json"
        d1 = daemon_factory(cfg, env=env)
        with d1.client(timeout=60) as c:
            before = {a: c.load(a) for a in aliases[:2]}
            wait_for(lambda: _records(state) == set(aliases[:2]), what="two records")
            whole = state.read_bytes()
            assert len(whole) > 4096
            filler = _fill(mnt, leave=4096)
            before["fd-c"] = c.load("fd-c")
            assert c.status("fd-c")[0].state == "ready"
        out = wait_for(
            lambda: "cannot write state file" in d1.output() and d1.output(),
            what="the failure in the daemon log",
        )
        assert "ERROR" in out and "No space left on device" in out
        assert state.read_bytes() == whole  # the old record, whole
        assert _temps(state.parent) == []
        trees = {a: session_of(e.pid) for a, e in before.items()}
        d1.stop(signal.SIGKILL)

        d2 = daemon_factory(cfg, env=env)
        with d2.client(timeout=60) as c:
            for a, e in before.items():
                now = wait_for(state_is(c, a, "ready"), timeout=20, what=f"{a} adopted")
                assert (now.pid, now.port) == (e.pid, e.port)
            assert all(alive(pid) for tree in trees.values() for pid in tree)
            out = d2.output()
            assert "recovered engine fd-c" in out and "killed" not in out
            filler.unlink()  # space is back: the periodic retry writes the full record
            wait_for(
                lambda: _records(state) == set(aliases),
                timeout=20,
                what="the record to be rewritten",
            )
            assert "written again after" in d2.output()
            c.evict(all=True)
        assert_clean(*(e.port for e in before.values()))


def test_corrupt_state_file_is_set_aside_and_nothing_is_killed(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """Attack 1, its aftermath: a truncated ``engines.json`` (what the old bug left).

    Now: the next ktd logs "state file ... is corrupt ...; set aside as
    engines.json.corrupt-<ts>", keeps that file for the operator, and re-adopts both
    engines by their markers: same pids, nothing killed."""
    cfg = write_config([sim_model("cr-a"), sim_model("cr-b")], daemon=FAST_DAEMON)
    state_dir = Path(ktd_env["KTD_STATE_DIR"])
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        before = {a: c.load(a) for a in ("cr-a", "cr-b")}
    d1.stop(signal.SIGKILL)
    path = state_dir / "engines.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        for a, e in before.items():
            now = wait_for(state_is(c, a, "ready"), timeout=20, what=f"{a} adopted")
            assert (now.pid, now.port) == (e.pid, e.port)
        out = d2.output()
        assert "is corrupt" in out and "set aside as engines.json.corrupt-" in out
        assert "killed" not in out
        [aside] = state_dir.glob("engines.json.corrupt-*")
        assert aside.read_bytes() == data[: len(data) // 2]
        wait_for(lambda: _records(path) == set(before), what="a fresh record")
        c.evict(all=True)
    assert_clean(*(e.port for e in before.values()))


# ---------------------------------------------------------------- attack 2: two daemons


@pytest.mark.parametrize("how", ["socket-flag", "runtime-dir"])
def test_second_daemon_on_the_same_state_dir_fails_naming_the_holder(
    write_config: ConfigWriter,
    daemon_factory: Any,
    ktd_env: dict[str, str],
    runtime_dir: Path,
    how: str,
) -> None:
    """Attack 2: a second ``ktd serve`` on another socket, same state dir.

    Before: it started, took the engines over, and stopping it killed the first daemon's
    engine. Now: it exits 1 at once with "state dir ... is in use by another ktd (pid
    <first>)"; the first daemon and its engine are untouched."""
    cfg = write_config([sim_model("two-kt")], daemon=FAST_DAEMON)
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        first = c.load("two-kt")
    if how == "socket-flag":
        d2 = daemon_factory(cfg, start=False)
        d2.extra_args = ["--socket", str(runtime_dir / "other.sock")]
    else:
        d2 = daemon_factory(
            cfg, start=False, env={**ktd_env, "KTD_RUNTIME_DIR": str(runtime_dir / "run2")}
        )
    d2.start(wait=False)
    assert d2.proc.wait(10) == 1
    assert f"is in use by another ktd (pid {d1.proc.pid}" in d2.output()
    assert not (runtime_dir / "other.sock").exists()
    assert not (runtime_dir / "run2" / "control.sock").exists()
    with d1.client(timeout=60) as c:
        [now] = c.status("two-kt")
        assert (now.state, now.pid) == ("ready", first.pid)
        c.evict("two-kt")
    assert d1.stop() == 0
    assert_clean(first.port)


# ---------------------------------------------------------------- attack 3: symlinked dirs


@pytest.mark.parametrize("which", ["KTD_RUNTIME_DIR", "KTD_STATE_DIR"])
def test_symlinked_runtime_or_state_dir_is_a_startup_error(
    write_config: ConfigWriter,
    daemon_factory: Any,
    ktd_env: dict[str, str],
    tmp_path: Path,
    which: str,
) -> None:
    """Attack 3: ``ln -s <someone's dir> $KTD_RUNTIME_DIR; ktd serve``.

    Before: the target was chmod-ed 0700 and the sockets bound in it. Now: ktd exits 1
    with "... is a symlink; refusing to follow it"; the target's mode and contents are
    unchanged."""
    target = tmp_path / "victim"
    target.mkdir()
    target.chmod(0o755)
    (target / "precious").write_text("x")
    link = Path(ktd_env[which])
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    d = daemon_factory(write_config([sim_model("ln-kt")]), start=False)
    d.start(wait=False)
    assert d.proc.wait(10) == 1
    assert "is a symlink; refusing to follow it" in d.output()
    assert (target.stat().st_mode & 0o777) == 0o755
    assert sorted(os.listdir(target)) == ["precious"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory someone else's")
def test_runtime_dir_of_another_owner_or_open_mode_is_a_startup_error(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """Attack 3, variants: a runtime dir owned by someone else, or writable by everyone,
    is refused ("owned by uid 65534" / "writable by others"), never chmod-ed."""
    run = Path(ktd_env["KTD_RUNTIME_DIR"])
    run.mkdir(parents=True)
    os.chown(run, 65534, 65534)
    cfg = write_config([sim_model("own-kt")])
    d = daemon_factory(cfg, start=False)
    d.start(wait=False)
    assert d.proc.wait(10) == 1 and "owned by uid 65534" in d.output()
    os.chown(run, 0, 0)
    run.chmod(0o777)
    d2 = daemon_factory(cfg, start=False)
    d2.start(wait=False)
    assert d2.proc.wait(10) == 1 and "writable by others" in d2.output()
    assert (run.stat().st_mode & 0o777) == 0o777


# ---------------------------------------------------------------- attack 4: forged records


def test_forged_record_never_gets_a_foreign_process_signalled(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """Attack 4: ``engines.json`` names another program's pid, start time and cmdline.

    Before: that program's whole session was SIGKILLed at the next start. Now: the log
    says the record was "not adopted, not signalled" (no engine marker), status shows
    the model stopped, and the foreign session survives a load, an evict and the
    daemon's shutdown."""
    state_dir = Path(ktd_env["KTD_STATE_DIR"])
    instance = statefile.instance_key(state_dir)
    # A foreign program in its own session, with a child in that session and group.
    foreign = subprocess.Popen(
        ["sh", "-c", "sleep 600 & exec sleep 600"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        session = wait_for(
            lambda: len(session_of(foreign.pid)) == 2 and session_of(foreign.pid),
            what="the foreign session",
        )
        info = proctree.read_stat(foreign.pid)
        assert info is not None
        forged = statefile.EngineRecord(
            alias="forge-kt",
            pid=foreign.pid,
            start=info.start,
            engine_id=f"{instance}/forge-kt@1",
            port=1,
            argv=proctree.cmdline(foreign.pid),
            state="ready",
            started_at=time.time() - 3600,
        )
        statefile.write(state_dir / "engines.json", statefile.StateFile(engines=[forged]))
        cfg = write_config([sim_model("forge-kt")], daemon=FAST_DAEMON)
        d = daemon_factory(cfg)
        with d.client(timeout=60) as c:
            assert "not adopted, not signalled" in d.output()
            [e] = c.status("forge-kt")
            assert (e.state, e.pid) == ("stopped", None)
            time.sleep(FAST_DAEMON["hang_timeout"] + 1)  # a hang check would have fired
            loaded = c.load("forge-kt")
            assert loaded.pid != foreign.pid
            c.evict("forge-kt")
        assert d.stop() == 0
        assert all(alive(pid) for pid in session)
        assert "Traceback" not in d.output()
    finally:
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait()
    assert_clean()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_forged_marker_in_another_users_process_is_never_signalled(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """Attack 4, variant: anyone can put ``KTD_ENGINE=<instance>/<alias>@1`` in their own
    process's environment (the instance key is a hash of the state dir's path). A
    process of another user carrying it is neither adopted nor killed, whether its alias
    is configured or not, and with or without a forged record naming it."""
    state_dir = Path(ktd_env["KTD_STATE_DIR"])
    instance = statefile.instance_key(state_dir)
    procs = []
    for alias in ("mk-kt", "unconfigured-kt"):
        env = {"PATH": "/usr/bin:/bin", ENGINE_MARK: f"{instance}/{alias}@1"}
        procs.append(
            subprocess.Popen(
                ["sh", "-c", "sleep 600; :", "--port", "1"],
                env=env,
                user=65534,
                group=65534,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        )
    try:
        wait_for(
            lambda: all(proctree.environ_has(p.pid, ENGINE_MARK) for p in procs),
            what="the forgers to start",
        )
        info = proctree.read_stat(procs[0].pid)
        assert info is not None
        forged = statefile.EngineRecord(
            alias="mk-kt",
            pid=procs[0].pid,
            start=info.start,
            engine_id=f"{instance}/mk-kt@1",
            port=1,
            argv=proctree.cmdline(procs[0].pid),
        )
        state_dir.mkdir(parents=True, mode=0o700)
        statefile.write(state_dir / "engines.json", statefile.StateFile(engines=[forged]))
        d = daemon_factory(write_config([sim_model("mk-kt")], daemon=FAST_DAEMON))
        with d.client(timeout=60) as c:
            [e] = c.status("mk-kt")
            assert (e.state, e.pid) == ("stopped", None)
            loaded = c.load("mk-kt")
            c.evict("mk-kt")
        assert d.stop() == 0
        assert all(f.poll() is None for f in procs)
        assert "killed" not in d.output() and "recovered" not in d.output()
    finally:
        for f in procs:
            os.killpg(f.pid, signal.SIGKILL)
            f.wait()
    assert_clean(loaded.port)


# ---------------------------------------------------------------- attack 7: numbers, frames


def _raw_request(sock_path: Path, payload: bytes, timeout: float = 10.0) -> p.Reply:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(f"ipc://{sock_path}")
        s.send(payload)
        assert s.poll(int(timeout * 1000)), "no reply"
        return p.decode_reply(s.recv())
    finally:
        s.close()


@pytest.mark.parametrize(
    "op,fields",
    [
        ("load", {"alias": "num-kt"}),
        ("acquire", {"model": "num-kt", "client": "c"}),
        ("evict", {"alias": "num-kt"}),
    ],
)
def test_nan_inf_and_negative_timeouts_are_bad_requests(
    write_config: ConfigWriter, daemon_factory: Any, op: str, fields: dict[str, Any]
) -> None:
    """Attack 7: ``{"op": "load", "timeout": NaN}`` on the control socket.

    Before: ``internal`` error, and the load started anyway. Now: ``bad_request`` naming
    ``$.timeout``, with the request's id, and nothing starts."""
    d = daemon_factory(write_config([sim_model("num-kt")], daemon=FAST_DAEMON))
    for i, bad in enumerate([math.nan, math.inf, -math.inf, -1.0, 1e12]):
        payload = msgspec.msgpack.encode({"op": op, "id": 100 + i, "timeout": bad, **fields})
        reply = _raw_request(d.socket, payload)
        assert isinstance(reply, p.Error), reply
        assert (reply.code, reply.id) == ("bad_request", 100 + i)
        assert "$.timeout" in reply.message
    time.sleep(0.3)
    with d.client() as c:
        [e] = c.status("num-kt")
        assert (e.state, e.pid) == ("stopped", None)
    assert not engine_procs()
    assert "Traceback" not in d.output()


def test_oversized_frame_reply_carries_the_request_id(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """A request over the 1 MiB limit gets ``bad_request`` with its own id (read from the
    frame's first bytes without decoding it), so a client can match the error."""
    d = daemon_factory(write_config([sim_model("big-kt")]))
    payload = p.encode(p.Load(id=4242, alias="x" * (p.MAX_FRAME + 1)))
    reply = _raw_request(d.socket, payload)
    assert isinstance(reply, p.Error) and (reply.code, reply.id) == ("bad_request", 4242)
    assert "exceeds" in reply.message


# ---------------------------------------------------------------- attack 7: the deleted log


def test_deleted_engine_log_is_still_rotated_and_shown_after_restart(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """Attack 7: ``rm`` of a running engine's log.

    Before: the unlinked file grew without bound (53 KB against a 4 KB limit) and after
    a daemon restart ``ktctl logs`` showed nothing of the engine. Now: ktd follows the
    engine's own file descriptor, so rotation still bounds it, and a restarted ktd finds
    it through the engine's stdout: ``ktctl logs`` shows lines written to the deleted file
    before the restart and new ones after."""
    daemon = {**FAST_DAEMON, "log_max_bytes": 4096, "log_backups": 1}
    cfg = write_config([sim_model("rm-kt")], daemon=daemon)
    log_path = Path(ktd_env["KTD_STATE_DIR"]) / "logs" / "rm-kt.log"
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        e = c.load("rm-kt")
        log_path.unlink()
        engine_file = f"/proc/{e.pid}/fd/1"
        url = f"http://127.0.0.1:{e.port}"
        auth = engine_auth(e.port)
        with httpx.Client(trust_env=False, timeout=5, headers=auth) as http:
            for i in range(400):  # ~100 bytes of access log each: ~40 KB in all
                assert http.get(f"{url}/v1/models", params={"n": f"before-{i}"}).status_code == 200
        wait_for(lambda: os.stat(engine_file).st_size < 4096, what="rotation of the deleted file")
        assert not log_path.exists()
        assert (log_path.parent / "rm-kt.log.1").exists()
        # The engine writes its access line after the answer: wait for the last one.
        wait_for(lambda: "before-399" in "\n".join(c.logs("rm-kt", 2000)), what="last line")
        assert "was removed or replaced" in "\n".join(c.logs("rm-kt", 2000))
    d1.stop(signal.SIGKILL)
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        wait_for(state_is(c, "rm-kt", "ready"), what="adopted")
        with httpx.Client(trust_env=False, timeout=5, headers=auth) as http:
            assert http.get(f"{url}/v1/models", params={"n": "after-restart"}).status_code == 200
        r = d2.ktctl("logs", "rm-kt", "-n", "200")
        assert r.returncode == 0, r.stderr

        def shows_both() -> bool:
            out = d2.ktctl("logs", "rm-kt", "-n", "200").stdout
            return "after-restart" in out and "before-" in out

        # Each try starts a ktctl process; on a loaded box 15 s is only a handful of tries.
        wait_for(shows_both, timeout=60, what="old and new engine lines in ktctl logs")
        c.evict("rm-kt")
    assert_clean(e.port)


def test_sigkilled_daemon_leaves_no_state_temp_and_next_one_starts(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    """A temp file left by a daemon killed mid-write is removed by the next one (under the
    lock, so it cannot be another daemon's write in progress)."""
    state_dir = Path(ktd_env["KTD_STATE_DIR"])
    state_dir.mkdir(parents=True, mode=0o700)
    stale = state_dir / ".engines.json.99999.tmp"
    stale.write_text('{"version": 1, "engi')
    d = daemon_factory(write_config([sim_model("tmp-kt")]))
    assert not stale.exists() and "removed" in d.output()
    assert d.stop() == 0


def test_engines_do_not_inherit_the_state_dir_lock(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """An engine holding the lock would block every later daemon after a ``kill -9`` of
    ktd (engines outlive it): the lock fd is close-on-exec."""
    d = daemon_factory(write_config([sim_model("lk-kt")], daemon=FAST_DAEMON))
    with d.client(timeout=60) as c:
        e = c.load("lk-kt")
        fds = os.listdir(f"/proc/{e.pid}/fd")
        targets = {os.readlink(f"/proc/{e.pid}/fd/{fd}") for fd in fds}
        assert not any(t.endswith("ktd.lock") for t in targets)
        c.evict("lk-kt")
    assert d.stop() == 0
