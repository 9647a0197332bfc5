"""The daemon end to end: real ``ktd serve``, real ipc sockets, sim engines through the shim."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from tests.conftest import (
    MARK,
    REPO,
    RUN_ID,
    SHIM,
    ConfigWriter,
    marked_processes,
    sim_model,
    sim_paths,
    wait_for,
)
from tests.fixtures.contract import STATUS_FIELDS


def engine_procs() -> list[tuple[int, list[str]]]:
    return [(pid, cmd) for pid, cmd in marked_processes() if proctree.environ_has(pid, ENGINE_MARK)]


def port_in_use(port: int) -> bool:
    return not proctree.port_free("127.0.0.1", port)


def test_load_status_evict_end_to_end(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    record = tmp_path / "argv.json"
    cfg = write_config(
        [
            sim_model(
                "deepseek-v4-kt",
                kt={
                    "ctx": 8192,
                    "extra_args": ["--kt-method", "AMXINT4"],
                    "extra_env": f"KT_EXTRA=1 KTD_SIM_LOAD_TIME=0.2 KTD_SIM_RECORD='{record}'",
                },
            )
        ],
        ktransformers={"extra_env": {"PYTHONPATH": f"{SHIM}{os.pathsep}{REPO}"}},
    )
    d = daemon_factory(cfg)
    r = d.ktctl("load", "deepseek-v4-kt")
    assert r.returncode == 0, r.stderr + d.output()
    r = d.ktctl("status", "--json")
    assert r.returncode == 0, r.stderr
    engines = json.loads(r.stdout)["engines"]
    [e] = engines
    assert set(e) >= STATUS_FIELDS
    assert e["state"] == "ready" and e["in_flight"] == 0
    pid, port = e["pid"], e["port"]
    rec = json.loads(record.read_text())
    # The engine saw exactly the seed's flags (+ derived placement flags) + extra_args.
    args = rec["args"]
    assert e["argv"][:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert args == e["argv"][3:]
    assert args[:12] == [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        sim_paths("deepseek-v4-kt")[0],
        "--kt-weight-path",
        sim_paths("deepseek-v4-kt")[1],
        "--served-model-name",
        "deepseek-v4-kt",
        "--context-length",
        "8192",
    ]
    # extra_args last of the config's; then the engine's key file (issue 32).
    assert args[-4:-2] == ["--kt-method", "AMXINT4"]
    keys = Path(ktd_env["KTD_STATE_DIR"], "keys")
    assert args[-2:] == ["--config", str(keys / "deepseek-v4-kt.yml")]
    assert rec["env"].get("KT_EXTRA") == "1"
    # The tree: the engine and its scheduler child, all in the engine's session.
    members = [p for p in proctree.all_procs().values() if p.sid == pid]
    assert len(members) >= 2
    assert port_in_use(port)

    r = d.ktctl("evict", "deepseek-v4-kt")
    assert r.returncode == 0, r.stderr
    assert not engine_procs()
    assert not port_in_use(port)
    [e] = json.loads(d.ktctl("status", "--json").stdout)["engines"]
    assert e["state"] == "stopped" and e["pid"] is None


def test_exit_codes(write_config: ConfigWriter, daemon_factory: Any, runtime_dir: Path) -> None:
    cfg = write_config([sim_model("a-kt"), {"path": "/m", "backend": "ds4", "alias": "other"}])
    d = daemon_factory(cfg)
    assert d.ktctl("ping").returncode == 0
    r = d.ktctl("load", "deepseek-v4")
    assert r.returncode == 4 and "unknown_model" in r.stderr and "a-kt" in r.stderr
    assert d.ktctl("load", "other").returncode == 4
    assert d.ktctl("load").returncode == 2
    assert d.ktctl("frobnicate").returncode == 2
    t0 = time.monotonic()
    r = d.ktctl("--socket", str(runtime_dir / "none.sock"), "status")
    assert r.returncode == 3 and time.monotonic() - t0 < 2.5
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_crash_during_load_fails_fast_and_spares_others(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config(
        [
            sim_model("good-kt"),
            sim_model("bad-kt", env={"KTD_SIM_CRASH_DURING_LOAD": "1", "KTD_SIM_LOAD_TIME": "0.5"}),
        ],
        daemon={"one_engine_per_machine": False},
    )
    d = daemon_factory(cfg)
    assert d.ktctl("load", "good-kt").returncode == 0
    good = d.client().status("good-kt")[0]
    with d.client() as c, c.subscribe(["engine.bad-kt", "log.bad-kt"]) as sub:
        c.load("bad-kt", wait=False)
        crashed_at = failed_at = None
        deadline = time.monotonic() + 20
        while failed_at is None and time.monotonic() < deadline:
            ev = sub.get(timeout=1.0)
            if ev is None:
                continue
            if ev.lines and any("[ktd] stopped" in ln or "Traceback" in ln for ln in ev.lines):
                crashed_at = crashed_at or ev.time
            if ev.state == "failed":
                failed_at = ev.time
        assert failed_at is not None
    [bad] = d.client().status("bad-kt")
    assert bad.state == "failed" and bad.reason and "before it was ready" in bad.reason
    assert bad.log_tail, "failed engine must carry its log tail"
    r = d.ktctl("load", "bad-kt")
    assert r.returncode == 1 and "load_failed" in r.stderr
    # The other engine was untouched.
    [good2] = d.client().status("good-kt")
    assert good2.state == "ready" and good2.pid == good.pid


def test_exit_before_ready_reported_within_a_second(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config(
        [sim_model("bad-kt", env={"KTD_SIM_CRASH_DURING_LOAD": "1", "KTD_SIM_LOAD_TIME": "1.0"})]
    )
    d = daemon_factory(cfg)
    with d.client() as c:
        c.load("bad-kt", wait=False)
        info = wait_for(lambda: c.status("bad-kt")[0].pid and c.status("bad-kt")[0], what="spawn")
        pid = info.pid
        wait_for(
            lambda: (
                not proctree.alive((pid, proctree.read_stat(pid).start))
                if proctree.read_stat(pid)
                else True
            ),
            timeout=20,
            what="crash",
        )
        died = time.monotonic()
        wait_for(lambda: c.status("bad-kt")[0].state == "failed", timeout=5, what="failed")
        assert time.monotonic() - died < 1.0


def test_fifty_concurrent_loads_make_one_engine(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config([sim_model("one-kt", env={"KTD_SIM_LOAD_TIME": "0.5"})])
    d = daemon_factory(cfg)
    results: list[Any] = []

    def load() -> None:
        with d.client(timeout=60) as c:
            results.append(c.load("one-kt").pid)

    threads = [threading.Thread(target=load) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50 and len(set(results)) == 1
    roots = {proctree.read_stat(pid).sid for pid, _ in engine_procs()}
    assert roots == {results[0]}
    log = (Path(d.env["KTD_STATE_DIR"]) / "logs" / "one-kt.log").read_text()
    assert log.count("[ktd] starting:") == 1


def test_garbage_on_control_socket(write_config: ConfigWriter, daemon_factory: Any) -> None:
    d = daemon_factory(write_config([sim_model("a-kt")]))
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"ipc://{d.socket}")
    import msgspec

    frames = [
        b"",
        b"\x00",
        os.urandom(64),
        b"\xc1" * 10,
        msgspec.msgpack.encode({"op": "nope", "id": 7}),
        msgspec.msgpack.encode({"op": "load", "id": 8, "alias": 3}),
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode({"op": "ping", "id": "x"}),
        b"x" * (2 << 20),
    ]
    for f in frames:
        s.send(f)
    replies = []
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    while len(replies) < len(frames) and poller.poll(3000):
        replies.append(msgspec.msgpack.decode(s.recv()))
    assert len(replies) == len(frames)
    assert all(r["type"] == "error" and r["code"] == "bad_request" for r in replies)
    assert {r["id"] for r in replies} >= {7, 8}
    # Multi-frame garbage too.
    s.send_multipart([b"a", b"b", b"c"])
    s.close()
    with d.client() as c:
        assert c.ping().version
        assert c.status()[0].state == "stopped"


def test_a_huge_model_name_is_bad_request_on_every_op_and_never_echoed(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """A 900 KB alias fits in a frame; every op that names a model refuses it the same way."""
    import msgspec

    d = daemon_factory(write_config([sim_model("a-kt")]))
    huge = "x" * 900_000
    ops: list[dict[str, Any]] = [
        {"op": "load", "alias": huge},
        {"op": "load", "alias": huge, "dry_run": True},
        {"op": "evict", "alias": huge},
        {"op": "status", "alias": huge},
        {"op": "logs", "alias": huge},
        {"op": "acquire", "model": huge, "client": "c"},
        {"op": "claim", "model": huge, "client": "c"},
        {"op": "sync", "client": "c", "queued": {huge: 1}},
        {"op": "sync", "client": "c", "claims": [{"claim": "k", "alias": huge}]},
    ]
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"ipc://{d.socket}")
    try:
        for i, op in enumerate(ops, 1):
            s.send(msgspec.msgpack.encode({**op, "id": i}))
            assert s.poll(5000), op["op"]
            raw = s.recv()
            reply = msgspec.msgpack.decode(raw)
            assert reply["id"] == i and reply["type"] == "error", reply
            assert reply["code"] == "bad_request", reply
            assert "length <= 256" in reply["message"], reply["message"]
            assert len(raw) < 1000  # the name is not echoed back
        # 256 characters is still a name: the answer is about the model, not the request.
        s.send(msgspec.msgpack.encode({"op": "status", "alias": "y" * 256, "id": 99}))
        assert s.poll(5000)
        reply = msgspec.msgpack.decode(s.recv())
        assert reply["code"] == "unknown_model", reply
    finally:
        s.close()


def test_sigterm_tears_down_every_engine(write_config: ConfigWriter, daemon_factory: Any) -> None:
    cfg = write_config([sim_model("a-kt"), sim_model("b-kt")])
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        c.load("a-kt")
        c.load("b-kt")
    assert len({p for p, _ in engine_procs()}) >= 4
    assert d.stop(signal.SIGTERM) == 0
    assert not engine_procs()


def test_escaped_descendant_is_killed(write_config: ConfigWriter, daemon_factory: Any) -> None:
    d = daemon_factory(write_config([sim_model("esc-kt", env={"KTD_SIM_ESCAPE": "1"})]))
    with d.client(timeout=60) as c:
        e = c.load("esc-kt")
        escaped = wait_for(
            lambda: [p for p, _ in engine_procs() if proctree.read_stat(p).sid != e.pid],
            what="escaped grandchild",
        )
        assert escaped
        c.evict("esc-kt")
    assert not engine_procs()


def test_port_taken_at_bind_is_retried_on_another_port(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """SGLang binds only after its load: take the picked port during the load."""
    d = daemon_factory(write_config([sim_model("p-kt", env={"KTD_SIM_LOAD_TIME": "1.5"})]))
    with d.client(timeout=60) as c:
        c.load("p-kt", wait=False)
        taken = wait_for(lambda: c.status("p-kt")[0].port, what="picked port")
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        try:
            e = c.load("p-kt")
            assert e.state == "ready" and e.port != taken
            log = "\n".join(c.logs("p-kt", 500))
            assert "retrying once on another port" in log
            c.evict("p-kt")
        finally:
            blocker.close()


def test_missing_sglang_and_kt_kernel(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    # A shim dir with kt_kernel but no sglang, and one with neither.
    only_kt = tmp_path / "only_kt"
    (only_kt / "kt_kernel").mkdir(parents=True)
    (only_kt / "kt_kernel" / "__init__.py").write_text("__version__ = '0'\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = write_config(
        [
            sim_model("nosgl-kt", kt={"extra_env": {"PYTHONPATH": str(only_kt)}}),
            sim_model("nokt-kt", kt={"extra_env": {"PYTHONPATH": str(empty)}}),
        ]
    )
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        from ktctl import KtdError, planview

        # The dry run says it before a load fails (issue 43: "(None)" and "sglang: null").
        plan = c.load("nosgl-kt", dry_run=True)
        assert plan["sglang"] is None
        assert plan["sglang_error"].startswith("no SGLang in ")
        assert "a load would fail" in plan["sglang_error"]
        assert not any("(None)" in n for n in plan["notes"])
        text = planview.plan_text("nosgl-kt", plan)
        assert "  sglang:      MISSING: no SGLang in " in text
        assert "null" not in text and "(None)" not in text and "impossible" not in text
        with pytest.raises(KtdError) as e1:
            c.load("nosgl-kt")
        assert e1.value.code == "load_failed"
        assert "sglang is not importable" in e1.value.message
        assert "auto_build" in e1.value.message
        with pytest.raises(KtdError) as e2:
            c.load("nokt-kt")
        assert "kt_kernel is not importable" in e2.value.message
        assert "out of band" in e2.value.message
    assert not engine_procs()


def test_auto_build_runs_pip_in_the_engine_python(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    # A fake engine Python whose `-m pip install sglang-kt` "installs" the shim's sglang.
    only_kt = tmp_path / "site"
    (only_kt / "kt_kernel").mkdir(parents=True)
    (only_kt / "kt_kernel" / "__init__.py").write_text("__version__ = '0'\n")
    fake = tmp_path / "python"
    shim = Path(__file__).parents[2] / "ktd" / "sim" / "shim" / "sglang"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then\n'
        '  echo "pip got: $*"\n'
        f'  echo "Collecting sglang"; cp -r {shim} {only_kt}/sglang\n'
        '  echo "Successfully installed sglang"; exit 0\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    cfg = write_config(
        [
            sim_model(
                "ab-kt",
                kt={
                    "python": str(fake),
                    "extra_env": {
                        "PYTHONPATH": f"{only_kt}{os.pathsep}{Path(__file__).parents[2]}"
                    },
                },
            )
        ],
        ktransformers={"auto_build": True},
    )
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        e = c.load("ab-kt")
        assert e.state == "ready"
        log = "\n".join(c.logs("ab-kt", 500))
        assert "auto_build" in log and "Successfully installed sglang" in log
        # The kt fork, never upstream sglang; the installed kt-kernel pinned, never replaced.
        assert "pip got: -m pip install sglang-kt kt-kernel==0" in log
        c.evict("ab-kt")


def test_config_error_refuses_to_start(write_config: ConfigWriter, daemon_factory: Any) -> None:
    cfg = write_config([{"path": "/m", "backend": "kt", "alias": "bad:alias"}])
    d = daemon_factory(cfg, start=False)
    d.start(wait=False)
    assert d.proc.wait(10) == 2
    out = d.output()
    assert "models.json: $[0].alias" in out and "LoRA" in out


def test_second_daemon_on_same_socket_refused(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str], tmp_path: Path
) -> None:
    cfg = write_config([sim_model("a-kt")])
    daemon_factory(cfg)
    # Another state dir (the same one is refused earlier, by its lock: test_statelock).
    d2 = daemon_factory(cfg, start=False, env={**ktd_env, "KTD_STATE_DIR": str(tmp_path / "s2")})
    d2.start(wait=False)
    assert d2.proc.wait(10) == 1
    assert "already listening" in d2.output()


def test_runtime_dir_and_socket_modes(write_config: ConfigWriter, daemon_factory: Any) -> None:
    d = daemon_factory(write_config([sim_model("a-kt")]))
    assert (d.socket.parent.stat().st_mode & 0o777) == 0o700
    assert (d.socket.stat().st_mode & 0o077) == 0


def test_mark_is_inherited() -> None:
    assert os.environ[MARK] == RUN_ID


def test_daemon_cpus_applied_and_checked(write_config: ConfigWriter, daemon_factory: Any) -> None:
    cpu = max(os.sched_getaffinity(0))
    d = daemon_factory(write_config([sim_model("a-kt")], daemon={"cpus": [cpu]}))
    assert os.sched_getaffinity(d.proc.pid) == {cpu}
    bad = daemon_factory(write_config([sim_model("a-kt")], daemon={"cpus": [4096]}), start=False)
    bad.start(wait=False)
    assert bad.proc.wait(10) == 2 and "$.daemon.cpus" in bad.output()


def test_launch_follows_what_the_installed_sglang_declares(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    """The sim playing upstream sglang 0.5.23 (its real option catalogue): the default
    placement's --kt-numa-nodes is left out (and said so), an abbreviated user flag wins
    over the derived one without doubling it, and a flag this SGLang does not know fails
    the load before anything is launched, naming the flag and the SGLang."""
    upstream = {"KTD_SIM_SGLANG": "upstream"}
    rec = tmp_path / "up.json"
    cfg = write_config(
        [
            sim_model(
                "up-kt",
                record=rec,
                numa=[0],
                env=upstream,
                kt={"extra_args": ["--kt-cpu", "1", "--kt-num-gpu-experts", "0"]},
            ),
            sim_model(
                "bad-kt", numa="none", env=upstream, kt={"extra_args": ["--kt-numa-nodes", "0"]}
            ),
        ]
    )
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        e = c.load("up-kt")
        assert e.state == "ready" and e.sglang == "sglang 0.5.23+sim"
        assert "--kt-numa-nodes" not in e.argv and "--kt-cpuinfer" not in e.argv
        assert e.argv[e.argv.index("--kt-threadpool-count") + 1] == "1"
        assert e.argv[-6:-2] == ["--kt-cpu", "1", "--kt-num-gpu-experts", "0"]
        assert e.argv[-2] == "--config"  # the engine's key file (issue 32)
        assert e.notes == ["--kt-numa-nodes left out: not an option of sglang 0.5.23+sim"]
        seen = json.loads(rec.read_text())
        assert seen["args"] == e.argv[3:]  # what the engine got is what status says
        with pytest.raises(Exception) as err:
            c.load("bad-kt")
        assert getattr(err.value, "code", None) == "load_failed"
        assert "--kt-numa-nodes: not an option of sglang 0.5.23+sim" in str(err.value)
        assert c.status("up-kt")[0].state == "ready"  # the failed load touched nothing
        c.evict("up-kt")
    assert not engine_procs()


@pytest.mark.parametrize(("which", "code"), [("kt", -9), ("upstream", 0)])
def test_evict_is_sglangs_own_shutdown_not_a_crash(
    write_config: ConfigWriter, daemon_factory: Any, which: str, code: int
) -> None:
    """SIGTERM to the engine's main process only: SGLang drains and exits with its own
    status (-9 from the fork, 0 upstream; ktd's /health checks installed the drain
    handler); a group SIGTERM would kill the scheduler first, which SGLang (and the sim)
    report as a crash."""
    cfg = write_config([sim_model("m-kt", env={"KTD_SIM_SGLANG": which})])
    d = daemon_factory(cfg)
    with d.client(timeout=60) as c:
        e = c.load("m-kt")
        c.evict("m-kt")
        log = "\n".join(c.logs("m-kt", 200))
    assert "SIGTERM received" in log and "crashed" not in log and "SIGKILL to" not in log
    assert f"stopped cleanly by SIGTERM (pid {e.pid}, exit {code})" in log
    assert not engine_procs()


def test_a_removed_or_replaced_control_socket_is_bound_again(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """Issue 31, item 7: ``rm control.sock`` (systemd-tmpfiles, a mistake) left a running
    ktd unreachable for good. It notices (inotify on its runtime dir) and binds again."""
    d = daemon_factory(write_config([sim_model("sock-kt")]))
    for replace in (False, True):
        d.socket.unlink()
        if replace:
            d.socket.write_text("not a socket")
        wait_for(lambda: d.ktctl("status").returncode == 0, timeout=15, what="bound again")
        assert d.socket.is_socket() and (d.socket.stat().st_mode & 0o077) == 0
    events = d.socket.parent / "events.sock"
    events.unlink()
    wait_for(events.is_socket, timeout=15, what="events bound again")
    assert "binding it again" in d.output()


def test_serve_names_a_config_nested_too_deeply_instead_of_a_traceback(
    tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    """Issue 43: ``ktd serve`` with a hand-written config.json of 1,000 nested arrays died
    of RecursionError (a traceback); it names the file and exits as for any config error."""
    import subprocess

    cfg = tmp_path / "config.json"
    cfg.write_text('{"daemon": ' + "[" * 1000 + "]" * 1000 + "}")
    r = subprocess.run(
        [sys.executable, "-m", "ktd", "serve", "--config", str(cfg),
         "--socket", str(tmp_path / "c.sock")],
        env=ktd_env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"config error: {cfg}: not valid JSON: nested more than 128 levels deep" in r.stderr
