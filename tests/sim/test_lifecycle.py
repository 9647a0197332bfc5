"""The sim's process life: the sglang shim, the record, crashes, bind conflicts, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.sim.simharness import SHIM, SimProc, alive, wait_until

Factory = Callable[..., SimProc]


def test_shim_runs_the_sim_and_records_the_command_line(sim_factory: Factory) -> None:
    extra = ["--kt-method", "AMXINT4", "--kt-numa-nodes", "0", "1", "--tp-size", "1",
             "--disable-cuda-graph"]  # fmt: skip
    env = {"KT_KERNEL_DEBUG": "1", "CUDA_VISIBLE_DEVICES": "0", "SGLANG_FOO": "bar",
           "UNRELATED_VAR": "x"}  # fmt: skip
    sim = sim_factory(shim=True, env=env, args=extra)
    sim.wait_ready()
    rec = sim.record()
    assert rec["args"] == [
        "--host", "127.0.0.1", "--port", str(sim.port), "--model", "/models/Sim-MoE",
        "--served-model-name", "sim-model", "--context-length", "512", *extra,
    ]  # fmt: skip
    assert rec["cmdline"][1:3] == ["-m", "sglang.launch_server"]
    assert rec["cmdline"][3:] == rec["args"]
    assert rec["pid"] == sim.pid and rec["sid"] == sim.pid  # start_new_session
    assert rec["cpus_allowed"] == sorted(os.sched_getaffinity(0))
    picked = {k: v for k, v in rec["env"].items() if k != "KTD_TEST_RUN"}
    assert picked == {
        "CUDA_VISIBLE_DEVICES": "0",
        "KTD_SIM_LOAD_TIME": "0.2",
        "KTD_SIM_RECORD": str(sim.record_path),
        "KTD_SIM_WARMUP": "0.05",
        "KT_KERNEL_DEBUG": "1",
        "SGLANG_FOO": "bar",
    }
    assert rec["port"] == sim.port and alive(rec["scheduler_pid"])
    info = httpx.get(sim.url("/server_info")).json()
    assert info["kt_numa_nodes"] == [0, 1] and info["disable_cuda_graph"] is True


def test_child_dies_with_the_parent(sim_factory: Factory) -> None:
    sim = sim_factory()
    sim.wait_ready()
    child = sim.record()["scheduler_pid"]
    assert alive(child)
    os.kill(sim.pid, signal.SIGKILL)  # the parent only, not the group
    sim.wait_exit()
    wait_until(lambda: not alive(child), 3, "the scheduler to die through PDEATHSIG")


def test_shim_imports_are_cheap() -> None:
    code = (
        "import sys, sglang, kt_kernel\n"
        "print(sglang.__version__, kt_kernel.__version__, kt_kernel.__cpu_variant__)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ktd', 'trio', 'h11')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SHIM)},
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["0.7.2+sim 0.0.0-sim sim", "[]"]


def test_crash_during_load(sim_factory: Factory) -> None:
    sim = sim_factory(env={"KTD_SIM_CRASH_DURING_LOAD": "1", "KTD_SIM_LOAD_TIME": "0.4"})
    assert sim.wait_exit() == 1
    log = sim.log()
    assert "Load weight begin" in log and "Traceback (most recent call last)" in log
    assert "Scheduler hit an exception" in log and "Rank 0 scheduler is dead" in log
    assert "Load weight end" not in log and "Uvicorn running" not in log
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.url("/v1/models"))


def test_port_in_use_is_found_after_the_load(sim_factory: Factory) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sim = sim_factory(port=port)
        assert sim.wait_exit() == 1
    log = sim.log()
    line = (
        "ERROR:    [Errno 98] error while attempting to bind on address "
        f"('127.0.0.1', {port}): address already in use"
    )
    assert line in log
    assert log.index("Load weight end") < log.index(line)
    assert not alive(sim.record()["scheduler_pid"])


def test_sigterm_during_load_exits_at_once(sim_factory: Factory) -> None:
    sim = sim_factory(env={"KTD_SIM_LOAD_TIME": "30"})
    sim.wait_log("Load weight begin")
    child = sim.record()["scheduler_pid"]
    t0 = time.monotonic()
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.wait_exit(timeout=5) == -signal.SIGTERM
    assert time.monotonic() - t0 < 2
    wait_until(lambda: not alive(child), 3, "the scheduler to die with its parent")


def _stream_in_thread(sim: SimProc, max_tokens: int) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {"events": []}
    first = threading.Event()

    def run() -> None:
        events: list[str] = []
        out["events"] = events
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        try:
            with httpx.stream("POST", sim.url("/v1/chat/completions"), json=body, timeout=10) as r:
                for line in r.iter_lines():
                    if line:
                        events.append(line)
                        first.set()
        except httpx.HTTPError as exc:
            out["error"] = exc
        finally:
            first.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert first.wait(5)
    return thread, out


@pytest.mark.parametrize(("which", "code"), [("upstream", 0), ("kt", -signal.SIGKILL)])
def test_sigterm_drains_in_flight_then_exits_as_sglang_does(
    sim_factory: Factory, which: str, code: int
) -> None:
    """SIGTERM to the main process: /health 503, new requests still accepted, in-flight
    ones finish; then upstream exits 0 and the kt fork SIGKILLs its own tree (-9)."""
    # Every generation is held after its first token until the test opens the gate.
    env = {"KTD_SIM_HOLD": "1", "KTD_SIM_DRAIN": "5", "KTD_SIM_SGLANG": which}
    sim = sim_factory(env=env)
    sim.wait_ready()
    child = sim.record()["scheduler_pid"]
    thread, out = _stream_in_thread(sim, max_tokens=30)
    os.kill(sim.pid, signal.SIGTERM)
    sim.wait_log("Draining requests and shutting down")
    assert httpx.get(sim.url("/health")).status_code == 503
    late: list[int] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    asking = threading.Thread(
        target=lambda: late.append(
            httpx.post(sim.url("/v1/chat/completions"), json=body, timeout=10).status_code
        )
    )
    asking.start()
    wait_until(
        lambda: httpx.get(sim.url("/sim/stats")).json()["active"] == 2, 5, "the late request in"
    )
    httpx.post(sim.url("/sim/gate"), json={"open": True}).raise_for_status()
    asking.join(10)
    assert late == [200]
    thread.join(10)
    events = out["events"]
    assert isinstance(events, list) and events[-1] == "data: [DONE]" and "error" not in out
    assert sim.wait_exit() == code
    assert "Gracefully exiting... Remaining number of requests 0." in sim.log()
    assert not alive(child)


def test_sigterm_before_any_request_dies_of_it(sim_factory: Factory) -> None:
    """SGLang installs its drain handler at the first request; before that uvicorn's
    shutdown re-raises SIGTERM (a shell's 143). /v1/models does not install it; /health,
    a one-token generation through the tokenizer manager, does."""
    for probe_health, code in ((False, -signal.SIGTERM), (True, 0)):
        sim = sim_factory(env={"KTD_SIM_SGLANG": "upstream"})
        sim.wait_log("The server is fired up and ready to roll!")
        assert httpx.get(sim.url("/v1/models")).status_code == 200
        if probe_health:
            assert httpx.get(sim.url("/health")).status_code == 200
        os.kill(sim.pid, signal.SIGTERM)
        assert sim.wait_exit() == code


def test_drain_is_bounded_by_ktd_sim_drain(sim_factory: Factory) -> None:
    env = {"KTD_SIM_TOKEN_RATE": "20", "KTD_SIM_DRAIN": "0.3", "KTD_SIM_SGLANG": "upstream"}
    sim = sim_factory(env=env)
    sim.wait_ready()
    thread, out = _stream_in_thread(sim, max_tokens=200)  # 10 s: longer than the drain
    t0 = time.monotonic()
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.wait_exit(timeout=5) == 0
    assert time.monotonic() - t0 < 2
    thread.join(5)
    events = out["events"]
    assert isinstance(events, list) and "data: [DONE]" not in events
    assert "Remaining number of requests 1." in sim.log()


def test_crash_mid_stream_and_escaped_grandchild(sim_factory: Factory) -> None:
    sim = sim_factory(env={"KTD_SIM_CRASH_MID_STREAM": "3", "KTD_SIM_ESCAPE": "1"})
    sim.wait_ready()
    rec = sim.record()
    child, escaped = rec["scheduler_pid"], rec["escaped_pid"]
    assert alive(escaped) and os.getsid(escaped) == escaped != sim.pid
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    events: list[str] = []
    with (
        pytest.raises(httpx.HTTPError),  # the connection breaks mid-stream
        httpx.stream("POST", sim.url("/v1/chat/completions"), json=body) as r,
    ):
        events.extend(line for line in r.iter_lines() if line)
    assert len(events) == 3
    assert sim.wait_exit() == 1
    wait_until(lambda: not alive(child), 3, "the scheduler to die through PDEATHSIG")
    assert alive(escaped)  # outside the group and the parent's reach: ktd must find it
    # (sim_factory's teardown kills it, through the record)


def test_never_healthy_then_hang_after(sim_factory: Factory) -> None:
    sim = sim_factory(env={"KTD_SIM_NEVER_HEALTHY": "1", "KTD_SIM_HANG_AFTER": "1.0"})
    sim.wait_log("The server is fired up and ready to roll!")
    assert httpx.get(sim.url("/v1/models")).status_code == 200
    assert httpx.get(sim.url("/health")).status_code == 503
    sim.wait_log("every request hangs from now", timeout=5)
    # A stuck scheduler: generations hang, the HTTP server itself still answers.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.url("/v1/completions"), json={"prompt": "x"}, timeout=0.5)
    assert httpx.get(sim.url("/v1/models")).status_code == 200


def test_hung_scheduler_health_is_503_after_the_health_timeout(sim_factory: Factory) -> None:
    """SGLang's /health generates one token; with no scheduler output for
    SGLANG_HEALTH_CHECK_TIMEOUT (20 s; KTD_SIM_HEALTH_TIMEOUT here) it answers 503."""
    sim = sim_factory(env={"KTD_SIM_HANG_AFTER": "0", "KTD_SIM_HEALTH_TIMEOUT": "0.3"})
    sim.wait_log("every request hangs from now", timeout=5)
    assert httpx.get(sim.url("/health"), timeout=10).status_code == 503
    assert "Health check failed" in sim.log()


def test_ignore_sigterm(sim_factory: Factory) -> None:
    sim = sim_factory(env={"KTD_SIM_IGNORE_SIGTERM": "1"})
    sim.wait_ready()
    os.killpg(sim.pid, signal.SIGTERM)
    time.sleep(0.4)
    assert sim.proc.poll() is None and alive(sim.record()["scheduler_pid"])
    assert httpx.get(sim.url("/health")).status_code == 200


def test_scheduler_death_takes_the_server_down(sim_factory: Factory) -> None:
    sim = sim_factory()
    sim.wait_ready()
    os.kill(sim.record()["scheduler_pid"], signal.SIGKILL)
    assert sim.wait_exit() == 1
    assert "Received sigquit from a child process" in sim.log()


def test_group_sigterm_is_a_crash_to_sglang(sim_factory: Factory) -> None:
    """SIGTERM to the whole group kills the scheduler first: SGLang reports a crash, waits
    for crash diagnostics (5 s real, KTD_SIM_CRASH_DIAG here), then kills its tree."""
    sim = sim_factory(env={"KTD_SIM_ESCAPE": "1", "KTD_SIM_CRASH_DIAG": "0.2"})
    sim.wait_ready()
    escaped = sim.record()["escaped_pid"]
    os.killpg(sim.pid, signal.SIGTERM)  # the scheduler gets it too, as in a group kill
    assert sim.wait_exit() == -signal.SIGKILL
    assert "Subprocess scheduler_0 crashed with exit code -15. Triggering SIGQUIT" in sim.log()
    assert alive(escaped)  # the sim's own clean-up misses it, as the group kill did
