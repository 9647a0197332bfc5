"""``ktctl wait ALIAS --state S --timeout N`` (issue 37): built on the events socket, with a
status read after subscribing (no transition missed) and again after a gap (a daemon
restart); its exit codes; and a state a newer daemon adds, waited through. Against the
fake daemon, then once against a real one on a sim engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ktctl import Client
from ktctl.cli import EXIT_TIMED_OUT, build_parser
from ktd import protocol as p
from tests.conftest import ConfigWriter, sim_model
from tests.ktctl.ktctl_fakes import FakeDaemon
from tests.ktctl.ktctl_fakes import run_cli as run

Answer = list[p.Reply] | None


def engine(state: str, **kw: Any) -> p.EngineInfo:
    return p.EngineInfo(alias="m", state=state, pid=1234, port=30000, **kw)


def event(state: str, reason: str | None = None) -> p.Event:
    return p.Event(topic="engine.m", time=time.time(), alias="m", state=state, reason=reason)


def status_then(state: str, *then: p.Event) -> Callable[[p.Request, FakeDaemon], Answer]:
    """Status answers ``state`` (then ``ready`` once an event said so); the first status
    publishes ``then``: events after the status read, which a wait must see."""
    told: list[str] = []

    def handler(req: p.Request, d: FakeDaemon) -> Answer:
        if isinstance(req, p.Status):
            if req.alias != "m":
                return [p.Error(code="unknown_model", message=f"unknown model {req.alias!r}")]
            answer = told[-1] if told else state
            if not told:
                for ev in then:
                    d.publish(ev)
                told.extend(e.state for e in then if e.state)
            return [p.StatusReply(engines=[engine(answer)])]
        return [p.Error(code="bad_request", message="?")]

    return handler


def test_wait_parses_states_and_refuses_a_misspelt_one() -> None:
    a = build_parser().parse_args(["wait", "m", "--state", "ready", "--state", "asleep"])
    assert (a.alias, a.state, a.timeout) == ("m", ["ready", "asleep"], None)
    assert build_parser().parse_args(["wait", "m", "--timeout", "600"]).state is None
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["wait", "m", "--state", "redy"])
    assert exc.value.code == 2


def test_an_engine_already_there_returns_at_once(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = fake_daemon(status_then("ready"), echo_ids=True)
    code, out, _ = run(capsys, "wait", "m", "--timeout", "10", "--socket", str(d.path))
    assert code == 0 and out.startswith("m ready on 127.0.0.1:30000 (pid 1234)")


def test_a_transition_right_after_the_status_read_is_seen(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    """Subscribed before the status read: the event published while the status was
    answered arrives (and a newer daemon's state on the way is waited through)."""
    d = fake_daemon(status_then("starting", event("hibernating"), event("ready")), echo_ids=True)
    code, out, err = run(
        capsys,
        "--json",
        "wait",
        "m",
        "--state",
        "ready",
        "--timeout",
        "10",
        "--socket",
        str(d.path),
    )
    assert code == 0, err
    assert '"state": "ready"' in out


def test_a_load_that_fails_meanwhile_exits_1_with_its_reason(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = fake_daemon(status_then("starting", event("failed", "exit 1 before ready")), echo_ids=True)
    code, _, err = run(capsys, "wait", "m", "--timeout", "10", "--socket", str(d.path))
    assert code == 1
    assert err == "ktctl: load_failed: m failed while waited for: exit 1 before ready\n"


def test_not_reached_in_time_exits_5(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    d = fake_daemon(status_then("starting"), echo_ids=True)
    started = time.monotonic()
    code, _, err = run(capsys, "wait", "m", "--timeout", "0.5", "--socket", str(d.path))
    assert code == EXIT_TIMED_OUT == 5
    assert err == "ktctl: timeout: m is starting, not ready, after 0.5s\n"
    assert time.monotonic() - started < 5


def test_an_unknown_model_exits_4_and_no_daemon_exits_3(
    fake_daemon: Callable[..., FakeDaemon], capsys: pytest.CaptureFixture[str], rundir: Path
) -> None:
    d = fake_daemon(status_then("ready"), echo_ids=True)
    assert run(capsys, "wait", "nope", "--socket", str(d.path))[0] == 4
    assert run(capsys, "wait", "m", "--socket", str(rundir / "none.sock"))[0] == 3


def test_a_daemon_restart_during_the_wait_reads_the_status_again(
    fake_daemon: Callable[..., FakeDaemon],
) -> None:
    """The first daemon says ``starting`` and goes; the next one has it ``ready`` and
    publishes nothing about it (that transition happened while nobody listened). Its
    greeting of the renewed subscription is the gap that makes the wait ask again."""
    first = fake_daemon(status_then("starting"), echo_ids=True)
    result: list[Any] = []

    def waiting() -> None:
        try:
            with Client(first.path, timeout=10) as c:
                result.append(c.wait("m", ["ready"], timeout=30))
        except Exception as exc:
            result.append(exc)

    t = threading.Thread(target=waiting)
    t.start()
    deadline = time.monotonic() + 10
    while not first.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.requests, "the wait never read the status"
    first.close()
    second = fake_daemon(status_then("ready"), echo_ids=True)
    t.join(30)
    assert not t.is_alive()
    assert len(result) == 1 and isinstance(result[0], p.EngineInfo), result
    assert result[0].state == "ready" and len(second.requests) == 1


def test_wait_against_a_real_daemon(write_config: ConfigWriter, daemon_factory: Any) -> None:
    d = daemon_factory(write_config([sim_model("m", env={"KTD_SIM_LOAD_TIME": 1})]))
    ran = d.ktctl("wait", "m", "--state", "ready", "--timeout", "0.3")
    assert ran.returncode == 5, ran.stderr  # stopped: nothing loads it
    assert d.ktctl("load", "m", "--no-wait").returncode == 0
    ran = d.ktctl("--json", "wait", "m", "--state", "ready", "--timeout", "60")
    assert ran.returncode == 0, ran.stderr
    assert '"state": "ready"' in ran.stdout
    with d.client() as c:
        c.evict("m")
    assert d.ktctl("wait", "m", "--state", "stopped", "--timeout", "30").returncode == 0
