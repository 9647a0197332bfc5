"""The harness's shared stack (``tests/stack.py``) and its event waits, on a real daemon."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ktd.daemon.engine import proctree
from tests.conftest import MARK, RUN_ID, SHARED, marked_processes, sim_model
from tests.stack import Stack, StackFactory


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    return stack_factory([sim_model("st-a"), sim_model("st-b")], with_frontend=False)


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


def test_reset_restores_the_modules_config_and_stops_every_engine(stack: Stack) -> None:
    with stack.daemon.client(timeout=30) as c:
        c.load("st-a")
        stack.write([sim_model("st-a"), sim_model("st-b"), sim_model("st-c")])
        c.reload()
        c.load("st-c")
    assert len(stack.engine_pids()) == 2 * 2  # two sims, each with its scheduler child
    stack.reset()
    engines = stack.daemon.engines()
    assert sorted(engines) == ["st-a", "st-b"]  # st-c went with the module's config
    assert {e["state"] for e in engines.values()} == {"stopped"}
    assert not stack.engine_pids()
    assert json.loads((stack.writer.root / "models.json").read_text())[-1]["alias"] == "st-b"


def test_the_per_test_leak_check_leaves_the_shared_processes_alone(stack: Stack) -> None:
    assert stack.daemon.proc is not None
    pid = stack.daemon.proc.pid
    assert proctree.environ_get(pid, MARK) == SHARED != RUN_ID
    assert pid not in {p for p, _ in marked_processes()}  # not this test's to leave behind
    assert pid in {p for p, _ in marked_processes(shared=True)}  # but the module's
    with stack.daemon.client(timeout=30) as c:
        e = c.load("st-a")
    # Engines inherit the shared marker: the module's check covers them too.
    assert proctree.environ_get(e.pid, MARK) == SHARED


def test_wait_engine_returns_on_the_event_and_fails_at_its_bound(stack: Stack) -> None:
    d = stack.daemon
    with d.client(timeout=30) as c:
        c.load("st-b", wait=False)
    e = d.wait_state("st-b", "ready", timeout=30)
    assert e["pid"]
    with pytest.raises(AssertionError, match=r"timed out after 0.3s waiting for state"):
        d.wait_state("st-a", "ready", timeout=0.3)
    # A crash is seen through the engine's own event: starting again (restarted).
    os.killpg(e["pid"], signal.SIGKILL)
    again = d.wait_engine("st-b", lambda x: x["pid"] not in (None, e["pid"]), timeout=30)
    assert again["restarts"] == 1


def test_a_dead_shared_daemon_is_named_not_reused(stack_factory: StackFactory) -> None:
    own = stack_factory([sim_model("st-x")], with_frontend=False)
    assert own.daemon.proc is not None
    own.daemon.stop(signal.SIGKILL)
    with pytest.raises(AssertionError, match="the module's daemon died"):
        own.reset()
