"""ktd's sleep and wake on the real SGLang server (issue 40), and the beliefs they rest on.

The real server runs here with ``--enable-memory-saver --enable-weights-cpu-backup
--sleep-on-idle`` as ktd launches a ``"sleep": true`` model: torch_memory_saver itself
needs libcuda, so the engine's PYTHONPATH carries a stand-in of its Python surface and
state machine (``standins/torch_memory_saver``) that frees nothing. Everything else is
SGLang's own: the release's assertion, the door (``/pause_generation``), the flush, the
resume, ``/continue_generation``, the readiness check after it. What the memory itself
does is for a GPU box: ``ktctl sleep --verify`` is the command to run there; here it runs
on this CPU server and its output is printed (``-s``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktd.daemon.engine.key import admin_key_of_argv, key_of_argv
from tests.conftest import DaemonProc
from tests.real import engine_env

ALIAS = "tiny"
MEASURED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def daemon(venv_python: Any, request: pytest.FixtureRequest) -> Iterator[DaemonProc]:
    failed_before = request.session.testsfailed
    root = Path(tempfile.mkdtemp(prefix="ktd-real-sleep-", dir="/tmp"))
    model = {
        "path": engine_env.model_dir(),
        "backend": "kt",
        "alias": ALIAS,
        "sleep": True,
        "kt": {"extra_args": engine_env.ENGINE_FLAGS, "extra_env": engine_env.engine_env(base={})},
    }
    daemon_settings = {"stop_grace": 60, "drain_timeout": 60, "health_interval": 2}
    config, env = engine_env.ktd_config(root, venv_python(), [model], daemon_settings)
    d = DaemonProc(config=Path(config), env=env, log_path=root / "ktd.log").start()
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop(timeout=120)
        if request.session.testsfailed == failed_before:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nthe real sleep stack's logs are kept in {root}")


def status(d: DaemonProc) -> dict[str, Any]:
    r = d.ktctl("status", "--json")
    assert r.returncode == 0, r.stderr
    engines: list[dict[str, Any]] = json.loads(r.stdout)["engines"]
    return next(e for e in engines if e["alias"] == ALIAS)


def test_sleep_verify_on_the_real_server(daemon: DaemonProc) -> None:
    """The GPU box's one command, run here: the real engine is loaded with the memory
    saver's flags, put to sleep through ktd's fence (door, flush, a fresh reading), its
    memory released, resumed, its door opened, checked, ready: the same process."""
    t0 = time.monotonic()
    r = daemon.ktctl("load", ALIAS)
    assert r.returncode == 0, r.stderr
    MEASURED["load_s"] = time.monotonic() - t0
    engine = status(daemon)
    assert "--enable-memory-saver" in engine["argv"] and engine["sleep"] == "on"
    r = daemon.ktctl("sleep", "--verify", ALIAS)
    print(f"\n$ ktctl sleep --verify {ALIAS}\n{r.stdout}{r.stderr}")
    assert r.returncode == 0, r.stderr
    assert f"{ALIAS}: slept in" in r.stdout and "host, NUMA node" in r.stdout
    assert "SGLang: weights" in r.stdout  # SGLang's own figures, from /v1/loads
    after = status(daemon)
    assert after["state"] == "ready" and after["pid"] == engine["pid"]
    log = daemon.ktctl("logs", ALIAS, "-n", "400").stdout
    order = [
        log.find(s)
        for s in (
            "pause_generation",
            "flush_cache",
            "release_memory",
            "resume_memory",
            "continue_generation",
        )
    ]
    assert all(i >= 0 for i in order) and order == sorted(order), order


def test_a_release_with_a_request_in_the_running_batch_takes_the_server_down(
    daemon: DaemonProc,
) -> None:
    """The belief the fence rests on, on the real server: SGLang's scheduler asserts that
    nothing runs when it releases, and the assertion kills it. A request is caught in the
    running batch and held there by SGLang's own in-place pause (ktd never uses it: the
    scheduler spins); the release then takes the engine down, and ktd sees it exit."""
    engine = status(daemon)
    base, argv = engine["url"], engine["argv"]
    auth = {"authorization": f"Bearer {key_of_argv(argv)[0]}"}  # generations, /v1/loads
    admin = {"authorization": f"Bearer {admin_key_of_argv(argv)}"}  # the admin-level routes
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 240, "ignore_eos": True}}
    died = False
    with httpx.Client(timeout=60) as http:
        for _ in range(20):  # the tiny model is fast: catch a request while it runs
            t = threading.Thread(
                target=_ignore,
                args=(lambda: http.post(base + "/generate", json=body, headers=auth),),
            )
            t.start()
            caught = False
            while t.is_alive() and not caught:
                load = http.get(base + "/v1/loads?include=core", headers=auth).json()["loads"][0]
                caught = bool(load["num_running_reqs"])
            if caught:
                http.post(base + "/pause_generation", json={"mode": "in_place"}, headers=admin)
                try:
                    http.post(
                        base + "/release_memory_occupation", json={"tags": None}, headers=admin
                    )
                except httpx.HTTPError:
                    died = True  # no answer: the scheduler's assertion took it down
                if not died:  # it finished just before the pause: put things back, again
                    http.post(
                        base + "/resume_memory_occupation", json={"tags": None}, headers=admin
                    )
                    http.post(base + "/continue_generation", json={}, headers=admin)
            t.join(60)
            if died:
                break
    assert died, "never caught a request in the running batch"
    deadline = time.monotonic() + 120
    while status(daemon)["pid"] == engine["pid"]:
        assert time.monotonic() < deadline, "the engine outlived the failed assertion"
        time.sleep(0.5)
    log = daemon.ktctl("logs", ALIAS, "-n", "1000").stdout
    assert "release_memory_occupation should be called only when server is idle" in log


def _ignore(call: Any) -> None:
    try:
        call()
    except httpx.HTTPError:
        pass
