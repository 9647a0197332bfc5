"""``ktctl sleep``/``ktctl wake`` and ``Client.sleep``/``Client.wake`` against the fake daemon,
and how ``ktctl status`` shows sleeping, asleep and waking engines (issue 28)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from ktctl import Client, KtdError, render
from ktctl.cli import build_parser, main
from ktd import protocol as p
from tests.ktctl.ktctl_fakes import FakeDaemon
from tests.ktctl.ktctl_fakes import run_cli as run

Answer = list[p.Reply] | None
Handler = Callable[[p.Request], Answer]

GIB = 1 << 30
NO_SLEEP_MSG = (
    "m cannot sleep: sglang 0.4.6 has no --enable-memory-saver "
    "(install sglang-kt or SGLang >= 0.4.9); its swaps stop and reload"
)


def asleep(since: float, **kw: object) -> p.EngineInfo:
    fields: dict[str, object] = {
        "alias": "m", "state": "asleep", "pid": 1234, "port": 30000, "since": since,
        "asleep_since": since, "sleep": "on", "host_bytes": 120 * GIB, "numa_nodes": [0, 1],
        "gpus": [0], "started_at": since - 600,
    }  # fmt: skip
    return p.EngineInfo(**{**fields, **kw})  # type: ignore[arg-type]


def ready(since: float, **kw: object) -> p.EngineInfo:
    fields: dict[str, object] = {
        "alias": "m", "state": "ready", "pid": 1234, "port": 30000, "since": since,
        "url": "http://127.0.0.1:30000", "sleep": "on", "numa_nodes": [0, 1], "gpus": [0],
    }  # fmt: skip
    return p.EngineInfo(**{**fields, **kw})  # type: ignore[arg-type]


def sleepy(*, was_asleep: bool = False, was_ready: bool = False) -> Handler:
    """One model ``m`` that can sleep; ``x`` cannot (no_sleep); ``off`` is not running."""

    def handler(req: p.Request) -> Answer:
        alias = getattr(req, "alias", None)
        if alias == "x":
            return [p.Error(code="no_sleep", message=NO_SLEEP_MSG, detail={"sleep": "unsupported"})]
        if alias == "off" and isinstance(req, p.Sleep):
            msg = "off is stopped: only a running engine can sleep"
            return [p.Error(code="not_loaded", message=msg, detail={"state": "stopped"})]
        if alias != "m":
            return [p.Error(code="unknown_model", message=f"unknown model {alias!r}")]
        # ``since``: when the engine entered its state; before the request = a no-op.
        now = time.time()
        match req:
            case p.Sleep():
                return [p.LoadReply(engine=asleep(now - 300 if was_asleep else now))]
            case p.Wake():
                return [p.LoadReply(engine=ready(now - 300 if was_ready else now))]
        return [p.Error(code="bad_request", message="?")]

    return handler


# ---------------------------------------------------------------- parsing


def test_sleep_and_wake_parse() -> None:
    parser = build_parser()
    a = parser.parse_args(["sleep", "m", "--timeout", "30"])
    assert (a.command, a.alias, a.timeout) == ("sleep", "m", 30.0)
    a = parser.parse_args(["wake", "m"])
    assert (a.command, a.alias, a.timeout) == ("wake", "m", None)
    a = parser.parse_args(["--json", "wake", "m", "--timeout", "2.5", "--socket", "/s"])
    assert (a.json, a.socket, a.timeout) == (True, "/s", 2.5)


@pytest.mark.parametrize(
    "argv",
    [
        ["sleep"],
        ["wake"],
        ["sleep", "m", "n"],
        ["sleep", "--all"],
        ["wake", "m", "--force"],
        ["sleep", "m", "--timeout", "0"],
        ["wake", "m", "--timeout", "-1"],
        ["wake", "m", "--timeout", "soon"],
        ["sleep", "m", "--timeout", "inf"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------- the commands


def test_sleep_text_json_and_wire(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy())
    code, out, err = run(capsys, "sleep", "m", "--timeout", "20", "--socket", str(d.path))
    assert code == 0 and err == ""
    assert out.startswith(
        "m is asleep (GPU memory released; experts kept in host RAM, 120.0 GiB), slept in "
    )
    assert out.endswith("s\n") and out.count("\n") == 1
    req = d.requests[-1]
    assert isinstance(req, p.Sleep) and (req.alias, req.timeout) == ("m", 20.0)

    code, out, _ = run(capsys, "--json", "sleep", "m", "--socket", str(d.path))
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"engine", "elapsed", "already"}
    assert doc["already"] is False and doc["elapsed"] >= 0
    assert doc["engine"]["state"] == "asleep" and doc["engine"]["host_bytes"] == 120 * GIB
    req = d.requests[-1]
    assert isinstance(req, p.Sleep) and req.timeout is None


def test_sleep_of_an_asleep_engine_says_already(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy(was_asleep=True))
    code, out, _ = run(capsys, "sleep", "m", "--socket", str(d.path))
    assert code == 0
    assert (
        out == "m was already asleep (GPU memory released; experts kept in host RAM, 120.0 GiB)\n"
    )
    code, out, _ = run(capsys, "sleep", "m", "--json", "--socket", str(d.path))
    assert json.loads(out)["already"] is True


def test_wake_text_json_and_wire(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy())
    code, out, err = run(capsys, "wake", "m", "--socket", str(d.path))
    assert code == 0 and err == ""
    assert out.startswith("m is ready on http://127.0.0.1:30000 (pid 1234), woke in ")
    assert out.endswith("s\n") and out.count("\n") == 1
    req = d.requests[-1]
    assert isinstance(req, p.Wake) and (req.alias, req.timeout) == ("m", None)

    code, out, _ = run(capsys, "wake", "m", "--json", "--timeout", "9", "--socket", str(d.path))
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"engine", "elapsed", "already"} and doc["already"] is False
    assert doc["engine"]["state"] == "ready" and doc["engine"]["url"] == "http://127.0.0.1:30000"
    req = d.requests[-1]
    assert isinstance(req, p.Wake) and req.timeout == 9.0


def test_wake_of_a_ready_engine_says_already(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy(was_ready=True))
    code, out, _ = run(capsys, "wake", "m", "--socket", str(d.path))
    assert (code, out) == (0, "m was already ready on http://127.0.0.1:30000 (pid 1234)\n")
    code, out, _ = run(capsys, "--json", "wake", "m", "--socket", str(d.path))
    assert json.loads(out)["already"] is True


@pytest.mark.parametrize("command", ["sleep", "wake"])
def test_no_sleep_exits_1_with_the_daemons_reason(
    command: str, daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy())
    code, out, err = run(capsys, command, "x", "--socket", str(d.path))
    assert (code, out) == (1, "")
    assert err == f"ktctl: no_sleep: {NO_SLEEP_MSG}\n"
    code, out, err = run(capsys, command, "x", "--json", "--socket", str(d.path))
    assert code == 1
    assert json.loads(out) == {
        "error": {"code": "no_sleep", "message": NO_SLEEP_MSG, "detail": {"sleep": "unsupported"}}
    }
    assert err == f"ktctl: no_sleep: {NO_SLEEP_MSG}\n"


@pytest.mark.parametrize("command", ["sleep", "wake"])
def test_unknown_model_exits_4(
    command: str, daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy())
    code, out, err = run(capsys, command, "nope", "--socket", str(d.path))
    assert (code, out) == (4, "")
    assert err == "ktctl: unknown_model: unknown model 'nope'\n"
    code, out, _ = run(capsys, command, "nope", "--json", "--socket", str(d.path))
    assert code == 4 and json.loads(out)["error"]["code"] == "unknown_model"


def test_sleep_of_a_stopped_model_exits_1(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = daemon(sleepy())
    code, _, err = run(capsys, "sleep", "off", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: not_loaded: off is stopped: only a running engine can sleep\n"


@pytest.mark.parametrize("command", ["sleep", "wake"])
def test_unreachable_exits_3(
    command: str, rundir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, command, "m", "--socket", str(rundir / "control.sock"))
    assert (code, out) == (3, "")
    assert err.startswith("ktctl: unreachable: ktd is not running") and err.count("\n") == 1


def test_a_sleep_that_ends_serving_or_stopped_exits_1(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    """A safety net: ktd raises for these itself, but a reply not asleep is no success."""
    engines = [
        ready(0.0, reason="a request came in"),
        p.EngineInfo(alias="m", state="failed", reason="release failed", log_tail=["boom"]),
    ]
    d = daemon(lambda req: [p.LoadReply(engine=engines.pop(0))])
    code, _, err = run(capsys, "sleep", "m", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: busy: m is ready, not asleep: a request came in\n"
    code, out, err = run(capsys, "sleep", "m", "--json", "--socket", str(d.path))
    assert code == 1
    doc = json.loads(out)["error"]
    assert (
        doc["code"] == "load_failed" and doc["message"] == "m is failed, not asleep: release failed"
    )
    assert doc["detail"]["log_tail"] == ["boom"] and doc["detail"]["engine"]["state"] == "failed"


def test_a_wake_that_ends_failed_exits_1_with_the_log_tail(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    failed = p.EngineInfo(alias="m", state="failed", reason="resume failed", log_tail=["OOM"])
    d = daemon(lambda req: [p.LoadReply(engine=failed)])
    code, out, err = run(capsys, "wake", "m", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: load_failed: m is failed, not ready: resume failed\n"
    assert "  OOM" in out


def test_a_failed_resume_error_exits_1(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    detail = {"state": "failed", "log_tail": ["CUDA error: out of memory"]}

    def failing(req: p.Request) -> Answer:
        return [p.Error(code="load_failed", message="m: resume failed", detail=detail)]

    d = daemon(failing)
    code, out, err = run(capsys, "wake", "m", "--socket", str(d.path))
    assert code == 1 and err == "ktctl: load_failed: m: resume failed\n"
    assert "last 1 log lines of m:" in out and "CUDA error: out of memory" in out


def test_wake_on_a_tty_shows_progress(
    daemon: Callable[[Handler], FakeDaemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def slow(req: p.Request) -> Answer:
        time.sleep(0.4)  # a few progress ticks
        return sleepy()(req)

    d = daemon(slow)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run(capsys, "wake", "m", "--socket", str(d.path))
    assert code == 0 and out.startswith("m is ready on ")
    assert "\r\x1b[Km waking " in err and err.endswith("\r\x1b[K")
    code, out, err = run(capsys, "sleep", "m", "--socket", str(d.path))
    assert code == 0 and out.startswith("m is asleep ")
    assert "\r\x1b[Km sleeping " in err and err.endswith("\r\x1b[K")


@pytest.mark.parametrize(
    ("command", "says"),
    [("wake", "ktd goes on waking m"), ("sleep", "ktd goes on putting m to sleep")],
)
def test_interrupted_wait_says_ktd_goes_on(
    command: str, says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Client, alias: str, **kw: object) -> p.EngineInfo:
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, command, interrupted)
    code, _, err = run(capsys, command, "m")
    assert code == 130 and says in err and err.count("\n") == 1


# ---------------------------------------------------------------- the client


def test_client_sleep_and_wake(daemon: Callable[[Handler], FakeDaemon]) -> None:
    d = daemon(sleepy())
    with Client(d.path) as c:
        assert c.sleep("m").state == "asleep"
        assert c.sleep("m", timeout=3).asleep_since is not None
        assert c.wake("m").url == "http://127.0.0.1:30000"
        assert c.wake("m", timeout=4).state == "ready"
        with pytest.raises(KtdError) as info:
            c.wake("x")
        assert info.value.code == "no_sleep" and info.value.message == NO_SLEEP_MSG
        with pytest.raises(KtdError) as info:
            c.sleep("nope")
        assert info.value.code == "unknown_model"
    sent = [(type(r).__name__, r.timeout) for r in d.requests if isinstance(r, p.Sleep | p.Wake)]
    assert sent[:4] == [("Sleep", None), ("Sleep", 3), ("Wake", None), ("Wake", 4)]


def test_client_waits_past_its_own_timeout_for_a_wake(
    daemon: Callable[[Handler], FakeDaemon],
) -> None:
    """A wake is long: bounded by the daemon's deadline (plus grace), not the client's 0.3 s."""

    def slow(req: p.Request) -> Answer:
        time.sleep(0.8)
        return sleepy()(req)

    d = daemon(slow)
    with Client(d.path, timeout=0.3) as c:
        assert c.wake("m").state == "ready"
        assert c._long(None) == math.inf


def test_client_wake_progress_sees_the_engines_events(
    daemon: Callable[[Handler], FakeDaemon],
) -> None:
    fakes: list[FakeDaemon] = []

    def handler(req: p.Request) -> Answer:
        if isinstance(req, p.Wake):
            ev = p.Event(
                topic="engine.m", time=0.0, alias="m", state="waking", phase="resuming GPU memory"
            )
            fakes[0].publish(ev)  # from the fake's own thread: one socket, one thread
            time.sleep(0.2)  # the event travels before the reply
            return [p.LoadReply(engine=ready(time.time()))]
        return None

    d = daemon(handler)
    fakes.append(d)
    seen: list[p.Event] = []
    with Client(d.path) as c:
        engine = c.wake("m", progress=lambda ev: seen.append(ev) if ev else None)
    assert engine.state == "ready"
    assert [(e.state, e.phase) for e in seen] == [("waking", "resuming GPU memory")]


# ---------------------------------------------------------------- status and rendering


NOW = 10_000.0


def test_status_shows_asleep_sleeping_and_waking() -> None:
    engines = [
        ready(9000.0, started_at=9000.0, ttl=600.0, last_used=9700.0, expires_at=10300.0),
        p.EngineInfo(
            alias="s", state="sleeping", pid=2, port=30001, numa_nodes=[1], gpus=[1],
            started_at=9000.0, sleep="on", phase="releasing GPU memory",
        ),
        asleep(9700.0, alias="a", sleep_ttl=1800.0, started_at=8000.0),
        p.EngineInfo(
            alias="w", state="waking", pid=4, port=30003, numa_nodes=[1], gpus=[1],
            started_at=9000.0, sleep="on", phase="checking health after resume",
        ),
    ]  # fmt: skip
    lines = render.status_table(engines, NOW).splitlines()
    assert lines[0].split() == [
        "ALIAS", "STATE", "PHASE", "PID", "PORT", "NUMA", "GPUS", "IN_FLIGHT", "UPTIME", "USED",
        "UNTIL", "SLEEP", "REASON",
    ]  # fmt: skip
    assert lines[1].split() == [
        "m", "ready", "-", "1234", "30000", "0-1", "0", "0", "16m40s", "5m00s", "ago", "in",
        "5m00s", "on",
    ]  # fmt: skip
    assert lines[2].split() == [
        "s", "sleeping", "releasing", "GPU", "memory", "2", "30001", "1", "1", "0", "16m40s",
        "-", "-", "on",
    ]  # fmt: skip
    # Asleep: its process lives (UPTIME), its GPUs are released (in parentheses), its
    # experts stay in host RAM (PHASE), and sleep_ttl stops it (UNTIL).
    assert lines[3].split() == [
        "a", "asleep", "5m00s", "asleep,", "120.0", "GiB", "host", "RAM", "1234", "30000",
        "0-1", "(0)", "0", "33m20s", "-", "in", "25m00s", "on",
    ]  # fmt: skip
    assert "checking health after resume" in lines[4] and lines[4].split()[1] == "waking"
    assert len(lines) == 5


def test_status_asleep_without_details() -> None:
    bare = p.EngineInfo(alias="a", state="asleep", sleep="on")
    line = render.status_table([bare], NOW).splitlines()[1]
    assert line.split() == ["a", "asleep", "-", "-", "-", "-", "-", "0", "-", "-", "-", "on"]


def test_status_sleep_column_only_when_a_model_may_sleep() -> None:
    off = [p.EngineInfo(alias="m", state="ready", pid=1, started_at=NOW - 10)]
    assert "SLEEP" not in render.status_table(off, NOW)
    unsupported = [
        *off,
        p.EngineInfo(alias="u", state="ready", pid=2, started_at=NOW - 10, sleep="unsupported"),
    ]
    lines = render.status_table(unsupported, NOW).splitlines()
    assert lines[0].split()[-2:] == ["SLEEP", "REASON"]
    assert lines[1].split()[-1] == "-" and lines[2].split()[-1] == "unsupported"
    assert lines[3] == (
        'note: u: configured with "sleep": true, but its SGLang lacks --enable-memory-saver: '
        "it is stopped instead of put to sleep"
    )


def test_status_json_carries_the_sleep_fields(
    daemon: Callable[[Handler], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    a = asleep(9700.0, sleep_ttl=1800.0)
    d = daemon(lambda req: [p.StatusReply(engines=[a])])
    code, out, _ = run(capsys, "status", "--json", "--socket", str(d.path))
    assert code == 0
    doc = json.loads(out)["engines"][0]
    assert doc == msgspec.to_builtins(a)
    assert (doc["state"], doc["sleep"], doc["asleep_since"], doc["sleep_ttl"]) == (
        "asleep", "on", 9700.0, 1800.0,
    )  # fmt: skip
    assert doc["host_bytes"] == 120 * GIB


def test_sleep_and_wake_lines() -> None:
    a = asleep(1.0, sleep_ttl=1800.0)
    assert render.sleep_line(a, 3.21) == (
        "m is asleep (GPU memory released; experts kept in host RAM, 120.0 GiB), "
        "slept in 3.2s; stops after 30m00s asleep"
    )
    bare = p.EngineInfo(alias="m1", state="asleep")
    assert render.sleep_line(bare, already=True) == (
        "m1 was already asleep (GPU memory released; experts kept in host RAM)"
    )
    r = ready(1.0, made_room=["a", "b"])
    assert render.wake_line(r, 4.2) == (
        "m is ready on http://127.0.0.1:30000 (pid 1234), woke in 4.2s; "
        "made room: a, b (put to sleep or stopped)"
    )
    assert render.wake_line(r, 4.2, already=True) == (
        "m was already ready on http://127.0.0.1:30000 (pid 1234)"
    )
    no_url = p.EngineInfo(alias="m", state="ready", port=31000)
    assert render.wake_line(no_url) == "m is ready on http://127.0.0.1:31000"


def test_wake_progress_line_shows_no_load_eta() -> None:
    prog = render.LoadProgress("m", started=100.0, state="waking")
    assert prog.line(101.0, 80) == "m waking 1.0s"
    prog.update(
        p.Event(
            topic="engine.m", time=0, alias="m", state="waking", phase="resuming GPU memory",
            load_eta=300.0,
        )
    )  # fmt: skip
    assert prog.line(102.0, 80) == "m waking (resuming GPU memory) 2.0s"
    # A wake that falls back to a reload is a load again: its expected duration applies.
    prog.update(p.Event(topic="engine.m", time=0, alias="m", state="starting", phase="loading"))
    assert prog.line(103.0, 80) == "m starting (loading) 3.0s/~5m00s"
    load = render.LoadProgress("m", started=100.0)
    load.update(p.Event(topic="engine.m", time=0, alias="m", state="starting", load_eta=300.0))
    assert load.line(101.0, 80) == "m starting 1.0s/~5m00s"
