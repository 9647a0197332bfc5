"""The sim's memory API as SGLang 0.5.23 serves it (``ktd/sim/memory.py``): shapes, no
effect without the memory saver, generations failed and counted while released, the
death of a release with a request in flight and of a resume of what was not released,
and the fault knobs ktd's wake handling is tested with."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
from simharness import SimProc

Factory = Callable[..., SimProc]
SAVER = ["--enable-memory-saver", "--enable-weights-cpu-backup"]
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def info(sim: SimProc) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(sim.url("/get_server_info"), timeout=5).json()
    return data


def post(sim: SimProc, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    if body is None:
        body = {"tags": None}
    return httpx.post(sim.url(path), json=body, timeout=10, **kw)


def test_release_and_resume_answer_null_and_the_saver_frees_and_restores(
    sim_factory: Factory,
) -> None:
    sim = sim_factory(args=SAVER)
    sim.wait_ready()
    assert info(sim)["memory_occupation"] == "occupied"
    r = post(sim, "/release_memory_occupation")
    assert (r.status_code, r.text) == (200, "null")
    assert info(sim)["memory_occupation"] == "released"
    assert info(sim)["released_tags"] == ["cuda_graph", "kv_cache", "weights"]
    # Non-generating routes still answer; generations and /health fail and are counted.
    assert httpx.get(sim.url("/v1/models")).status_code == 200
    assert httpx.get(sim.url("/v1/loads")).status_code == 200
    assert httpx.post(sim.url("/v1/chat/completions"), json=CHAT).status_code == 500
    assert httpx.get(sim.url("/health")).status_code == 500
    assert info(sim)["generations_while_released"] == 2
    r = httpx.get(sim.url("/resume_memory_occupation"), params={}, timeout=10)
    assert r.status_code == 400  # a GET without a body: FastAPI's missing body
    r = post(sim, "/resume_memory_occupation", {"tags": ["weights", "kv_cache", "cuda_graph"]})
    assert (r.status_code, r.text) == (200, "null")
    assert info(sim)["memory_occupation"] == "occupied"
    assert httpx.post(sim.url("/v1/chat/completions"), json=CHAT).status_code == 200
    assert "released memory occupation" in sim.log()


def test_without_the_memory_saver_nothing_is_released_and_it_serves(
    sim_factory: Factory,
) -> None:
    sim = sim_factory()
    sim.wait_ready()
    assert post(sim, "/release_memory_occupation").status_code == 200
    assert info(sim)["memory_occupation"] == "occupied"
    assert httpx.post(sim.url("/v1/chat/completions"), json=CHAT).status_code == 200
    assert info(sim)["generations_while_released"] == 0
    assert post(sim, "/resume_memory_occupation").status_code == 200


def test_a_release_with_a_request_in_flight_takes_the_server_down(sim_factory: Factory) -> None:
    sim = sim_factory(args=SAVER, env={"KTD_SIM_TOKEN_RATE": "5"})
    sim.wait_ready()
    body = {**CHAT, "max_tokens": 50}
    running = threading.Thread(
        target=lambda: _quietly(lambda: httpx.post(sim.url("/v1/chat/completions"), json=body)),
        daemon=True,
    )
    running.start()
    _until(lambda: httpx.get(sim.url("/sim/stats")).json()["active"] == 1)
    _quietly(lambda: post(sim, "/release_memory_occupation"))
    assert sim.wait_exit() != 0
    assert "should be called only when server is idle" in sim.log()
    running.join(10)


def test_a_resume_of_memory_not_released_takes_the_server_down(sim_factory: Factory) -> None:
    sim = sim_factory(args=SAVER)
    sim.wait_ready()
    _quietly(lambda: post(sim, "/resume_memory_occupation"))
    assert sim.wait_exit() != 0 and "KeyError" in sim.log()


def test_resume_fail_and_hang_knobs(sim_factory: Factory) -> None:
    sim = sim_factory(args=SAVER, env={"KTD_SIM_RESUME_FAIL": "1"})
    sim.wait_ready()
    post(sim, "/release_memory_occupation")
    r = post(sim, "/resume_memory_occupation")
    assert r.status_code == 400 and "error" in r.json()
    assert info(sim)["memory_occupation"] == "released"
    hung = sim_factory(args=SAVER, env={"KTD_SIM_RESUME_HANG": "1"})
    hung.wait_ready()
    post(hung, "/release_memory_occupation")
    try:
        httpx.post(hung.url("/resume_memory_occupation"), json={}, timeout=0.5)
        raise AssertionError("the resume answered")
    except httpx.TimeoutException:
        pass


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except httpx.HTTPError:
        pass


def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
