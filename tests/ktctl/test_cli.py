"""ktctl's command line: parsing, exit codes, rendering, --json shapes, unreachable paths.

The CLI runs in-process (``main(argv)``) against a tiny in-test ROUTER+PUB
thread; one test runs ``python -X importtime -m ktctl`` to hold the start-up
contract (no trio/quart/hypercorn/httpx).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from ktctl import DaemonUnreachable, KtdError, ProtocolError, planview, render
from ktctl.cli import build_parser, exit_code, main
from ktctl.client import Client
from ktd import protocol as p
from tests.ktctl.ktctl_fakes import FakeDaemon
from tests.ktctl.ktctl_fakes import run_cli as run

REPO = Path(__file__).resolve().parents[2]

Answer = list[p.Reply] | None
Handler = Callable[[p.Request], Answer]


READY = p.EngineInfo(
    alias="deepseek-v4-kt",
    state="ready",
    pid=1234,
    port=30000,
    url="http://127.0.0.1:30000",
    argv=["python", "-m", "sglang.launch_server"],
    numa_nodes=[0, 1],
    gpus=[0],
    since=1000.0,
    in_flight=2,
)

PLAN: dict[str, Any] = {  # the shape of ktd.core.placement's Plan.to_dict() + dry_run_plan
    "alias": "deepseek-v4-kt",
    "ok": True,
    "numa_nodes": [0, 1],
    "cpus": [0, 1, 2, 3, 8],
    "cpulist": "0-3,8",
    "gpus": [0],
    "flags": [
        {"name": "--kt-cpuinfer", "values": ["60"], "origin": "placement"},
        {"name": "--tp-size", "values": ["1"], "origin": "extra_args"},
    ],
    "argv_flags": ["--kt-cpuinfer", "60"],
    "env": {"CUDA_VISIBLE_DEVICES": "0"},
    "evict": ["qwen-kt"],
    "blocked_by": [],
    "reason": None,
    "notes": ["numa node 1 has no GPU"],
    "argv": [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--port",
        "<auto>",
        "--kt-cpuinfer",
        "60",
    ],
    "state": "stopped",
    "running_pid": None,
    "python": "/venv/bin/python",
}


def canned(req: p.Request) -> Answer:
    """A daemon with one model, ``deepseek-v4-kt``; ``ds4-model`` is another backend's."""
    alias = getattr(req, "alias", None)
    if alias == "ds4-model":
        return [p.Error(code="not_kt", message="ds4-model is served by ds4, not ktd")]
    if alias not in (None, "deepseek-v4-kt"):
        return [p.Error(code="unknown_model", message=f"unknown model {alias!r}")]
    match req:
        case p.Ping():
            return [p.Pong(version="0.1.0", pid=77)]
        case p.Status():
            return [p.StatusReply(engines=[READY])]
        case p.Models():
            return [
                p.ModelsReply(
                    models=[
                        p.ModelInfo(alias="deepseek-v4-kt", backend="kt", served=True, path="/m"),
                        p.ModelInfo(alias="ds4-model", backend="ds4", served=False, path="/d"),
                    ]
                )
            ]
        case p.Load(dry_run=True):
            return [p.PlanReply(plan=PLAN)]
        case p.Load():
            return [p.LoadReply(engine=READY)]
        case p.Evict():
            return [p.EvictReply(evicted=["deepseek-v4-kt"])]
        case p.Logs():
            return [
                p.LogsReply(alias="deepseek-v4-kt", lines=[f"line {i}" for i in range(req.lines)])
            ]
        case p.Reload():
            return [p.Ok(message="reloaded: 1 model")]
        case p.Doctor():
            return [p.DoctorReply(report={"checks": [{"name": "numa", "status": "ok"}]})]
        case p.Shutdown():
            return [p.Ok(message="bye")]
    return [p.Error(code="bad_request", message="?")]


# ---------------------------------------------------------------- parsing


def test_every_command_parses() -> None:
    parser = build_parser()
    a = parser.parse_args(["load", "m", "--no-wait", "--timeout", "30", "--dry-run"])
    assert (a.command, a.alias, a.no_wait, a.timeout, a.dry_run) == ("load", "m", True, 30.0, True)
    a = parser.parse_args(["evict", "--all", "--force", "--timeout", "5"])
    assert (a.alias, a.all, a.force, a.timeout) == (None, True, True, 5.0)
    a = parser.parse_args(["logs", "m", "-f", "-n", "7"])
    assert (a.alias, a.follow, a.lines) == ("m", True, 7)
    assert parser.parse_args(["logs", "m"]).lines == 100
    assert parser.parse_args(["status"]).alias is None
    assert parser.parse_args(["status", "m"]).alias == "m"
    assert parser.parse_args(["events"]).topics == []
    assert parser.parse_args(["doctor", "--config", "/c.json"]).config == "/c.json"
    for cmd in ("models", "reload", "ping", "shutdown"):
        assert parser.parse_args([cmd]).command == cmd


def test_json_and_socket_are_global_and_per_command() -> None:
    parser = build_parser()
    a = parser.parse_args(["--json", "--socket", "/a", "status"])
    assert a.json is True and a.socket == "/a"
    a = parser.parse_args(["status", "--json", "--socket", "/b"])
    assert a.json is True and a.socket == "/b"
    a = parser.parse_args(["status"])
    assert not getattr(a, "json", False) and getattr(a, "socket", None) is None


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["load"],
        ["evict"],
        ["evict", "m", "--all"],
        ["logs", "m", "-n", "-1"],
        ["load", "m", "--timeout", "0"],
        ["load", "m", "--timeout", "soon"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_bad_ktctl_timeout_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTCTL_TIMEOUT", "never")
    with pytest.raises(SystemExit) as info:
        main(["ping"])
    assert info.value.code == 2


def test_exit_code_mapping() -> None:
    assert exit_code(DaemonUnreachable("x")) == 3
    assert exit_code(KtdError("unknown_model", "x")) == 4
    assert exit_code(KtdError("not_kt", "x")) == 4
    for code in ("load_failed", "busy", "timeout", "bad_request", "internal"):
        assert exit_code(KtdError(code, "x")) == 1
    assert exit_code(ProtocolError("x")) == 1


# ---------------------------------------------------------------- unreachable


def test_missing_socket_exits_3_with_one_line(
    rundir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rundir / "control.sock"
    code, out, err = run(capsys, "status", "--socket", str(path))
    assert code == 3 and out == ""
    assert err.splitlines() == [
        f"ktctl: unreachable: ktd is not running: no control socket at {path} "
        "(start it with `ktd serve` or `systemctl start ktd`, or try `ktd up --demo`)"
    ]


def test_missing_socket_json_error_document(
    rundir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--json", "ping", "--socket", str(rundir / "control.sock"))
    assert code == 3
    doc = json.loads(out)
    assert set(doc) == {"error"}
    assert doc["error"]["code"] == "unreachable" and doc["error"]["detail"] == {}
    assert "no control socket" in doc["error"]["message"]
    assert len(err.splitlines()) == 1


def test_socket_from_environment(
    rundir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KTD_SOCKET", str(rundir / "env.sock"))
    code, _, err = run(capsys, "ping")
    assert code == 3 and "env.sock" in err


def test_stale_socket_exits_3(rundir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = rundir / "control.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    t0 = time.monotonic()
    code, _, err = run(capsys, "ping", "--socket", str(path))
    assert code == 3 and time.monotonic() - t0 < 2
    assert "stale socket" in err and len(err.splitlines()) == 1


def test_silent_daemon_exits_3_within_the_timeout(
    rundir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"ipc://{rundir / 'control.sock'}")
    monkeypatch.setenv("KTCTL_TIMEOUT", "0.4")
    try:
        t0 = time.monotonic()
        code, _, err = run(capsys, "status", "--socket", str(rundir / "control.sock"))
        assert code == 3 and time.monotonic() - t0 < 1.5
        assert err.startswith("ktctl: unreachable: no reply from ktd") and err.count("\n") == 1
    finally:
        ctx.destroy(linger=0)


def test_importtime_and_unreachable_in_a_subprocess(rundir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KTD_SOCKET", None)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ktctl", "ping", "--socket", "/nonexistent"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert time.monotonic() - t0 < 2
    assert proc.returncode == 3
    imported = set()
    rest = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip().split(".")[0])
        else:
            rest.append(line)
    assert imported & {"zmq", "msgspec", "ktctl"} == {"zmq", "msgspec", "ktctl"}
    assert not imported & {"trio", "quart", "quart_trio", "hypercorn", "httpx", "httpcore"}
    assert rest == [
        "ktctl: unreachable: ktd is not running: no control socket at /nonexistent "
        "(start it with `ktd serve` or `systemctl start ktd`, or try `ktd up --demo`)"
    ]


# ---------------------------------------------------------------- against a fake daemon


def test_ping(daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "ping", "--socket", str(d.path))
    # A daemon whose Pong says no protocol speaks 1.0 (it has 1.0's features).
    assert code == 0 and out == f"ktd 0.1.0 (pid 77, protocol 1.0) on {d.path}\n"
    code, out, _ = run(capsys, "ping", "--json", "--socket", str(d.path))
    assert json.loads(out) == {
        "version": "0.1.0",
        "pid": 77,
        "protocol": {"major": 1, "minor": 0},
        "features": list(p.FEATURES_1_0),
        "socket": str(d.path),
    }


# A reply of a newer daemon (protocol 1.9): fields this ktctl does not know, at the top
# and inside the engine, and a state it does not know. It must show what it knows.
NEWER_STATUS = msgspec.msgpack.encode(
    {
        "type": "status",
        "engines": [
            {
                "alias": "m",
                "state": "hibernating",
                "pid": 9,
                "since": 1000.0,
                "zz_new_field": {"a": [1, 2]},
            }
        ],
        "zz_top": True,
    }
)
NEWER_PONG = msgspec.msgpack.encode(
    {
        "type": "pong",
        "version": "9.0",
        "pid": 5,
        "protocol": {"major": 1, "minor": 9, "patchlevel": 3},
        "features": ["sleep", "time_travel"],
        "zz_top": "x",
    }
)


def test_a_newer_daemon_s_replies_are_read_and_shown(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    def newer(req: p.Request, d: FakeDaemon) -> list[bytes]:
        frame = NEWER_PONG if isinstance(req, p.Ping) else NEWER_STATUS
        # The request's id, as a daemon stamps it: prefix the map with it.
        decoded = msgspec.msgpack.decode(frame)
        return [msgspec.msgpack.encode({**decoded, "id": req.id})]

    d = fake_daemon(newer)
    code, out, _ = run(capsys, "ping", "--socket", str(d.path))
    assert code == 0 and out == f"ktd 9.0 (pid 5, protocol 1.9) on {d.path}\n"
    code, out, err = run(capsys, "status", "--socket", str(d.path))
    assert code == 0, err
    assert "hibernating" in out.splitlines()[1]
    code, out, _ = run(capsys, "status", "--json", "--socket", str(d.path))
    [engine] = json.loads(out)["engines"]
    assert engine["state"] == "hibernating" and "zz_new_field" not in engine
    with Client(d.path) as c:
        [info] = c.status()
    assert info.state == "hibernating" and info.pid == 9


def test_schema_prints_the_daemon_s_and_with_local_this_ktctl_s(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    from ktd import protocol_schema

    theirs = {"title": "ktd control protocol 1.9", "$defs": {}}

    def handler(req: p.Request, d: FakeDaemon) -> list[p.Reply]:
        assert isinstance(req, p.Schema)
        reply = p.SchemaReply(protocol=p.ProtocolVersion(major=1, minor=9), schema=theirs)
        reply.id = req.id
        return [reply]

    d = fake_daemon(handler)
    code, out, _ = run(capsys, "schema", "--socket", str(d.path))
    assert code == 0 and json.loads(out) == theirs
    code, out, _ = run(capsys, "schema", "--local", "--socket", "/nonexistent")
    committed = protocol_schema.DOCS / f"ktd-control-{p.PROTOCOL}.json"
    assert code == 0 and out == committed.read_text()


def test_schema_of_a_1_0_daemon_is_a_bad_request(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)  # answers an op it does not know bad_request, as 1.0 did
    code, _, err = run(capsys, "schema", "--socket", str(d.path))
    assert code == 1 and err.startswith("ktctl: bad_request:")


def test_status_json_contract(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "--json", "--socket", str(d.path), "status")
    assert code == 0
    doc = json.loads(out)
    assert list(doc) == ["engines"]
    assert doc == {"engines": [msgspec.to_builtins(READY)]}
    required = {"alias", "state", "pid", "port", "argv", "numa_nodes", "gpus", "since", "reason"}
    assert required <= set(doc["engines"][0])
    # The wire struct: the deprecated ``leases`` rides along with ``in_flight``.
    assert doc["engines"][0]["in_flight"] == doc["engines"][0]["leases"] == 2


def test_status_human_and_unknown_model(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "status", "--socket", str(d.path))
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [
        "ALIAS",
        "STATE",
        "PHASE",
        "PID",
        "PORT",
        "NUMA",
        "GPUS",
        "IN_FLIGHT",
        "UPTIME",
        "USED",
        "UNTIL",
        "REASON",
    ]
    assert row.split()[:8] == ["deepseek-v4-kt", "ready", "-", "1234", "30000", "0-1", "0", "2"]
    code, out, err = run(capsys, "status", "deepseek-v4", "--json", "--socket", str(d.path))
    assert code == 4
    assert json.loads(out)["error"]["code"] == "unknown_model"
    assert err == "ktctl: unknown_model: unknown model 'deepseek-v4'\n"


def test_not_kt_exits_4(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, _, err = run(capsys, "load", "ds4-model", "--socket", str(d.path))
    assert code == 4 and err.startswith("ktctl: not_kt: ")


def test_models(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "models", "--socket", str(d.path))
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["deepseek-v4-kt", "kt", "yes", "stopped", "/m"]
    assert lines[2].split() == ["ds4-model", "ds4", "no", "-", "/d"]
    code, out, _ = run(capsys, "models", "--json", "--socket", str(d.path))
    assert [m["alias"] for m in json.loads(out)["models"]] == ["deepseek-v4-kt", "ds4-model"]


def test_load_not_a_tty_prints_the_final_line(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, out, err = run(capsys, "load", "deepseek-v4-kt", "--socket", str(d.path))
    assert code == 0 and err == ""
    assert out.startswith("deepseek-v4-kt ready on 127.0.0.1:30000 (pid 1234) in ")
    assert out.endswith("s\n") and out.count("\n") == 1
    load = d.requests[-1]
    assert isinstance(load, p.Load) and load.wait and load.timeout is None
    code, out, _ = run(capsys, "load", "deepseek-v4-kt", "--json", "--socket", str(d.path))
    doc = json.loads(out)
    assert doc["engine"] == msgspec.to_builtins(READY) and doc["elapsed"] >= 0


def test_load_on_a_tty_shows_progress(
    daemon: Callable[[Handler], FakeDaemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def slow(req: p.Request) -> Answer:
        if isinstance(req, p.Load):
            time.sleep(0.5)  # a few progress ticks
        return canned(req)

    d = daemon(slow)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run(capsys, "load", "deepseek-v4-kt", "--socket", str(d.path))
    assert code == 0
    assert out.startswith("deepseek-v4-kt ready on 127.0.0.1:30000 (pid 1234) in ")
    assert "\r\x1b[Kdeepseek-v4-kt loading " in err
    assert err.endswith("\r\x1b[K")  # the progress line is wiped before the result


def test_load_dry_run_prints_the_plan(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "load", "deepseek-v4-kt", "--dry-run", "--socket", str(d.path))
    assert code == 0
    assert "plan for deepseek-v4-kt" in out
    assert "/venv/bin/python -m sglang.launch_server" in out
    assert "--kt-cpuinfer 60" in out and "(placement)" in out and "(extra_args)" in out
    assert "CUDA_VISIBLE_DEVICES=0" in out
    assert "cpus:        0-3,8 (5 cpus)" in out
    assert "would evict: qwen-kt" in out
    assert "note: numa node 1 has no GPU" in out and "BLOCKED" not in out
    assert "argv_flags" not in out and "python:" not in out
    code, out, _ = run(
        capsys, "load", "deepseek-v4-kt", "--dry-run", "--json", "--socket", str(d.path)
    )
    assert json.loads(out) == {"plan": PLAN}


def test_failed_load_error_prints_reason_and_log_tail(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    detail = {"log_tail": ["Traceback (most recent call last):", "CUDA out of memory"]}

    def failing(req: p.Request) -> Answer:
        return [p.Error(code="load_failed", message="engine exited with 1", detail=detail)]

    d = daemon(failing)
    code, out, err = run(capsys, "load", "deepseek-v4-kt", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: load_failed: engine exited with 1\n"
    assert "CUDA out of memory" in out and "deepseek-v4-kt" in out
    code, out, err = run(capsys, "load", "deepseek-v4-kt", "--json", "--socket", str(d.path))
    assert code == 1
    assert json.loads(out) == {
        "error": {"code": "load_failed", "message": "engine exited with 1", "detail": detail}
    }


def test_failed_engine_in_load_reply_exits_1(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    failed = p.EngineInfo(
        alias="deepseek-v4-kt", state="failed", reason="exit 1 before ready", log_tail=["boom"]
    )
    d = daemon(lambda req: [p.LoadReply(engine=failed)])
    code, out, err = run(capsys, "load", "deepseek-v4-kt", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: load_failed: deepseek-v4-kt is failed: exit 1 before ready\n"
    assert "  boom" in out
    code, out, _ = run(capsys, "--json", "load", "deepseek-v4-kt", "--socket", str(d.path))
    doc = json.loads(out)
    assert doc["error"]["code"] == "load_failed"
    assert doc["error"]["detail"]["log_tail"] == ["boom"]
    assert doc["error"]["detail"]["engine"]["state"] == "failed"


def test_load_no_wait(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    starting = p.EngineInfo(alias="deepseek-v4-kt", state="starting", pid=5, port=31000)
    d = daemon(lambda req: [p.LoadReply(engine=starting)])
    code, out, _ = run(capsys, "load", "deepseek-v4-kt", "--no-wait", "--socket", str(d.path))
    assert code == 0 and out == "deepseek-v4-kt starting on 127.0.0.1:31000 (pid 5)\n"
    load = d.requests[-1]
    assert isinstance(load, p.Load) and not load.wait


def test_evict(daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "evict", "--all", "--force", "--socket", str(d.path))
    assert code == 0 and out == "evicted deepseek-v4-kt\n"
    ev = d.requests[-1]
    assert isinstance(ev, p.Evict) and ev.all and ev.force and ev.alias is None
    code, out, _ = run(capsys, "evict", "deepseek-v4-kt", "--json", "--socket", str(d.path))
    assert json.loads(out) == {"evicted": ["deepseek-v4-kt"]}


def test_logs(daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]) -> None:
    d = daemon(canned)
    code, out, _ = run(capsys, "logs", "deepseek-v4-kt", "-n", "3", "--socket", str(d.path))
    assert code == 0 and out == "line 0\nline 1\nline 2\n"
    code, out, _ = run(
        capsys, "logs", "deepseek-v4-kt", "-n", "1", "--json", "--socket", str(d.path)
    )
    assert json.loads(out) == {"alias": "deepseek-v4-kt", "lines": ["line 0"]}


def _interrupted(items: list[Any]) -> Callable[..., Iterator[Any]]:
    def gen(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from items
        raise KeyboardInterrupt

    return gen


def test_logs_follow_ends_quietly_on_ctrl_c(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Client, "follow_logs", _interrupted(["a", "b"]))
    code, out, err = run(capsys, "logs", "m", "-f")
    assert (code, out, err) == (0, "a\nb\n", "")
    code, out, err = run(capsys, "logs", "m", "-f", "--json")
    assert code == 0 and err == ""
    assert [json.loads(x) for x in out.splitlines()] == [
        {"alias": "m", "line": "a"},
        {"alias": "m", "line": "b"},
    ]


def test_events_lines_and_json_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    evs = [
        p.Event(topic="engine.m", time=0.0, alias="m", state="failed", reason="exit 1"),
        p.Event(topic="log.m", time=0.0, alias="m", lines=["x", "y"]),
    ]
    monkeypatch.setattr(Client, "events", _interrupted(evs))
    code, out, _ = run(capsys, "events")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].endswith(" engine.m failed exit 1")
    assert lines[1].endswith(" log.m | x") and lines[2].endswith(" log.m | y")
    code, out, _ = run(capsys, "events", "--json")
    assert [json.loads(x) for x in out.splitlines()] == [msgspec.to_builtins(e) for e in evs]


def test_events_leave_out_probe_lines_unless_asked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    health = '127.0.0.1:5 - "GET /health?ktd=probe HTTP/1.1" 200 OK'
    evs = [
        p.Event(topic="probe.m", time=0.0, alias="m", lines=[health]),
        p.Event(topic="log.m", time=0.0, alias="m", lines=["x"]),
    ]
    monkeypatch.setattr(Client, "events", _interrupted(evs))
    code, out, _ = run(capsys, "events")
    assert code == 0 and "GET /health" not in out and out.rstrip().endswith("log.m | x")
    code, out, _ = run(capsys, "events", "--probes")
    assert out.splitlines()[0].endswith(f"probe.m | {health}")


def test_events_against_a_live_publisher(
    daemon: Callable[[Handler], FakeDaemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = daemon(canned)
    real = Client.events

    def two_then_stop(self: Client, topics: Any = ("",)) -> Iterator[p.Event]:
        it = real(self, topics)
        ev = p.Event(topic="lease.deepseek-v4-kt", time=0.0, alias="deepseek-v4-kt", in_flight=3)
        d.outbox.put(ev)  # published by the fake's own thread: one socket, one thread
        yield next(it)
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "events", two_then_stop)
    code, out, _ = run(capsys, "events", "--socket", str(d.path))
    assert code == 0 and out.rstrip().endswith("lease.deepseek-v4-kt in_flight=3")


def test_reload_and_shutdown(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(canned)
    assert run(capsys, "reload", "--socket", str(d.path))[:2] == (0, "reloaded: 1 model\n")
    _, out, _ = run(capsys, "reload", "--json", "--socket", str(d.path))
    assert json.loads(out) == {"ok": True, "message": "reloaded: 1 model"}
    assert run(capsys, "shutdown", "--socket", str(d.path))[:2] == (0, "bye\n")


def test_doctor_from_the_daemon(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    report = {
        "checks": [
            {"name": "numa", "status": "ok", "detail": "2 nodes", "advice": ""},
            {"name": "kt_weight_path", "status": "warn", "detail": "unset", "advice": "set it"},
            {"name": "sglang", "status": "fail", "detail": "missing", "advice": "pip install"},
        ]
    }
    d = daemon(lambda req: [p.DoctorReply(report=report)])
    code, out, _ = run(capsys, "doctor", "--socket", str(d.path))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "ok    numa: 2 nodes"
    assert lines[1] == "warn  kt_weight_path: unset"
    assert lines[2] == "      -> set it"
    assert lines[3] == "fail  sglang: missing"
    code, out, _ = run(capsys, "doctor", "--json", "--socket", str(d.path))
    assert code == 1 and json.loads(out) == report


def test_doctor_runs_locally_when_ktd_is_down(
    rundir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    fake = types.ModuleType("ktd.checkup")

    def local_report(config: str | None = None) -> dict[str, Any]:
        calls.append(config)
        return {"checks": [{"name": "daemon", "status": "warn", "detail": "not running"}]}

    fake.local_report = local_report  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ktd.checkup", fake)
    sock = str(rundir / "control.sock")
    code, out, err = run(capsys, "doctor", "--socket", sock, "--config", "/etc/x.json")
    assert code == 0 and calls == ["/etc/x.json"]
    assert out.startswith("warn  daemon: not running")
    assert "running the checks locally" in err
    code, out, err = run(capsys, "doctor", "--json", "--socket", sock)
    assert code == 0 and json.loads(out)["checks"][0]["name"] == "daemon" and err == ""
    assert calls == ["/etc/x.json", None]


def test_doctor_without_local_checks_exits_3(
    rundir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ktd.checkup", None)  # makes the import fail
    code, _, err = run(capsys, "doctor", "--socket", str(rundir / "control.sock"))
    assert code == 3
    assert "local checks are not available" in err and len(err.splitlines()) == 1


def test_unexpected_exception_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: Client) -> p.Pong:
        raise RuntimeError("bug\nsecond line")

    monkeypatch.setattr(Client, "ping", boom)
    code, _, err = run(capsys, "ping")
    assert code == 1 and err.count("\n") == 1 and "RuntimeError: bug second line" in err


def test_interrupted_load_says_the_load_goes_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Client, alias: str, **kw: Any) -> p.EngineInfo:
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "load", interrupted)
    code, _, err = run(capsys, "load", "m")
    assert code == 130 and "ktctl evict m" in err and err.count("\n") == 1


# ---------------------------------------------------------------- rendering


def test_render_small_pieces() -> None:
    assert render.duration(12.34) == "12.3s"
    assert render.duration(245) == "4m05s"
    assert render.duration(7380) == "2h03m"
    assert render.duration(3 * 86400 + 4 * 3600) == "3d04h"
    assert render.ranges([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert render.ranges([]) == "-"
    assert render.truncate("abcdef", 5) == "ab..." and render.truncate("abc", 5) == "abc"
    assert render.one_line("\x1b[32mINFO\x1b[0m 10%\r 50%\n") == "50%"
    assert render.one_line("a\tb\x07") == "a b"


def test_engine_line_variants() -> None:
    assert (
        render.engine_line(READY, 12.34)
        == "deepseek-v4-kt ready on 127.0.0.1:30000 (pid 1234) in 12.3s"
    )
    stopped = p.EngineInfo(alias="m", state="stopped", reason="evicted")
    assert render.engine_line(stopped) == "m stopped: evicted"
    starting = p.EngineInfo(alias="m", state="starting", port=9, phase="loading weights")
    assert render.engine_line(starting) == "m starting (loading weights) on 127.0.0.1:9"
    swapped = msgspec.structs.replace(READY, made_room=["acc-main", "old"])
    assert render.engine_line(swapped, 32.1).endswith(
        "(pid 1234) in 32.1s; stopped acc-main, old to make room"
    )


def test_status_table_empty_and_reason() -> None:
    assert render.status_table([], 0) == "no engines"
    failed = p.EngineInfo(alias="m", state="failed", reason="exit 1\nmore", since=100.0)
    line = render.status_table([failed], 160.0).splitlines()[1]
    assert line.split() == [
        "m", "failed", "-", "-", "-", "-", "-", "0", "-", "-", "-", "exit", "1", "more",
    ]  # fmt: skip


def test_status_table_like_ollama_ps() -> None:
    """Phase (never a log line) with elapsed/expected load, uptime, last used, TTL expiry."""
    starting = p.EngineInfo(
        alias="s", state="starting", phase="loading weights", load_started=100.0,
        load_eta=300.0, started_at=100.0, pid=7,
    )  # fmt: skip
    ready = p.EngineInfo(
        alias="r", state="ready", started_at=10.0, last_used=130.0, ttl=600.0,
        expires_at=730.0, pid=8,
    )  # fmt: skip
    busy = p.EngineInfo(alias="b", state="ready", ttl=600.0, in_flight=1, started_at=100.0)
    lines = render.status_table([starting, ready, busy], 160.0).splitlines()
    assert "loading weights 1m00s/~5m00s" in lines[1]
    cells = lines[2].split()
    assert cells[1:3] == ["ready", "-"] and "2m30s" in cells and "in 9m30s" in lines[2]
    assert "30.0s" in cells and "ago" in cells
    assert "busy" in lines[3].split()


def test_plan_text_accepts_flag_dicts_and_blocks() -> None:
    plan = {
        "argv": ["py", "--a", "1"],
        "flags": {"--kt-numa-nodes": {"value": "0,1", "origin": "placement"}, "--x": "user"},
        "blocked_by": ["big-model"],
        "reason": "pinned",
        "ok": False,
        "extra": {"k": 1},
    }
    text = planview.plan_text("m", plan)
    assert "--kt-numa-nodes 0,1  (placement)" in text
    assert "--x" in text and "(user)" in text
    assert "BLOCKED by big-model: pinned" in text
    assert 'extra: {"k": 1}' in text
    assert "py \\\n      --a 1" in text


def test_doctor_render_and_failure() -> None:
    ok = {"checks": [{"name": "a", "status": "ok"}]}
    assert not render.doctor_failed(ok)
    assert render.doctor_text(ok).splitlines() == ["ok    a", "summary: 1 ok"]
    assert render.doctor_failed({"checks": [{"name": "a", "status": "FAIL"}]})
    assert render.doctor_text({}) == "doctor: no checks reported"


def test_load_progress_line_fits_the_terminal() -> None:
    prog = render.LoadProgress("m", started=100.0)
    assert prog.line(101.0, 80) == "m loading 1.0s"
    prog.update(p.Event(topic="engine.m", time=0, alias="m", state="starting", phase="weights"))
    prog.update(p.Event(topic="log.m", time=0, alias="m", lines=["x" * 200, "\x1b[1m  \x1b[0m"]))
    line = prog.line(112.3, 40)
    assert line.startswith("m starting (weights) 12.3s | xxx") and len(line) == 39
    prog.update(p.Event(topic="engine.m", time=0, alias="m", phase="x" * 200))
    assert prog.line(112.3, 300) == f"m starting ({'x' * 37}...) 12.3s"  # phase == last line
    prog.update(p.Event(topic="engine.m", time=0, alias="m", state="ready"))
    assert prog.line(113.0, 200).startswith("m ready 13.0s")


def test_event_lines_for_each_topic() -> None:
    lease = p.Event(topic="lease.m", time=0.0, alias="m", in_flight=2)
    assert render.event_lines(lease)[0].endswith(" lease.m in_flight=2")
    eng = p.Event(topic="engine.m", time=0.0, alias="m", state="ready", pid=3, port=4)
    assert render.event_lines(eng)[0].endswith(" engine.m ready pid=3 port=4")


def test_usage_table_csv_json_and_the_request_sent(
    daemon: Callable[[Handler], FakeDaemon],
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        p.UsageCount(day="2026-12-03", key="", model="m1", requests=1, prompt=2, completion=3),
        p.UsageCount(
            day="2026-12-04", key="bob", model="m2", requests=2, completion=9, errors=1, cut=1
        ),
    ]
    d = daemon(lambda req: [p.UsageReply(rows=rows)])
    code, out, _ = run(capsys, "usage", "--socket", str(d.path))
    assert code == 0
    assert out.splitlines() == [
        "DAY         KEY  MODEL  REQUESTS  PROMPT  COMPLETION  ERRORS  CUT",
        "2026-12-03  -    m1     1         2       3           0       0",
        "2026-12-04  bob  m2     2         0       9           1       1",
        "total                   3         2       12          1       1",
    ]
    code, out, _ = run(capsys, "usage", "--csv", "--key", "-", "--socket", str(d.path))
    assert out.splitlines()[:2] == [
        "day,key,model,requests,prompt,completion,errors,cut",
        "2026-12-03,,m1,1,2,3,0,0",
    ]
    _, out, _ = run(capsys, "usage", "--json", "--since", "2026-12-04", "--socket", str(d.path))
    assert json.loads(out)["usage"][1]["key"] == "bob"
    sent = [r for r in d.requests if isinstance(r, p.Usage)]
    assert [(r.since, r.key) for r in sent] == [("", None), ("", ""), ("2026-12-04", None)]
    d2 = daemon(lambda req: [p.UsageReply(rows=[])])
    assert run(capsys, "usage", "--since", "today", "--socket", str(d2.path))[1] == (
        "no usage recorded\n"
    )
    (asked,) = d2.requests
    assert isinstance(asked, p.Usage) and len(asked.since) == 10


@pytest.mark.parametrize(
    "argv", [["usage", "--since", "last week"], ["usage", "--csv", "--json"], ["usage", "x"]]
)
def test_usage_misuse_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
