"""The sim's memory API as SGLang 0.5.23 and the kt fork serve it (``ktd/sim/memory.py``).

Why each test: ktd's sleep and wake are tested against the sim, so the sim must answer
the two calls as SGLang does (status, body, validation errors), die where SGLang dies
(a release with a request in flight, a resume of what is not released, a second
release under the saver), free nothing without ``--enable-memory-saver``, and fail and
count every generation that reaches released memory, so ktd's tests can prove it sent
none. Every sim here is a real process (``simharness``); no assertion rests on a timing
margin (only lower bounds: a call cannot be faster than its knob).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.knobs import Knobs
from ktd.sim.memory import parse_tags
from tests.sim.simharness import SimProc, wait_until

Factory = Callable[..., SimProc]
SAVER = ["--enable-memory-saver", "--enable-weights-cpu-backup"]
FAST = {
    "KTD_SIM_LOAD_TIME": "0.05",
    "KTD_SIM_RELEASE_TIME": "0",
    "KTD_SIM_RESUME_TIME": "0",
    "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1",  # what ktd sets for a model that sleeps
}
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RELEASE, RESUME = "/release_memory_occupation", "/resume_memory_occupation"
ALL = ["kv_cache", "weights", "cuda_graph"]


def start(factory: Factory, args: list[str] = SAVER, *, wait: bool = True, **env: str) -> SimProc:
    sim = factory(args=args, env={**FAST, **env})
    if wait:
        sim.wait_ready()
    return sim


def info(sim: SimProc) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(sim.url("/get_server_info"), timeout=5).json()
    return data


def call(sim: SimProc, path: str, body: Any = None, timeout: float = 10) -> httpx.Response:
    """A memory call with a JSON body (``{"tags": null}`` by default: every tag)."""
    return httpx.post(sim.url(path), json={"tags": None} if body is None else body, timeout=timeout)


def chat(sim: SimProc, timeout: float = 10) -> httpx.Response:
    return httpx.post(sim.url("/v1/chat/completions"), json=CHAT, timeout=timeout)


def in_background(fn: Callable[[], httpx.Response]) -> Future[httpx.Response]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def dies_with_the_server(fn: Callable[[], object]) -> None:
    """The server goes down under this request: no answer, the connection drops."""
    with pytest.raises(httpx.TransportError):
        fn()


# -- in process


def request(body: bytes, ctype: str | None = "application/json") -> HttpRequest:
    headers = {} if ctype is None else {"content-type": ctype}
    return HttpRequest("POST", RELEASE, RELEASE, headers, body, "test:1", "1.1")


def errors(reply: list[str] | HttpReply | None) -> str:
    """The message of SGLang's 400 for a body FastAPI rejects."""
    assert isinstance(reply, HttpReply) and reply.status == 400, reply
    message: str = json.loads(reply.body)["message"]
    return message


def test_bodies_as_fastapi_reads_them_for_each_flavor() -> None:
    for which in ("kt", "upstream"):
        assert parse_tags(request(b"{}"), "release", which) is None  # all tags
        assert parse_tags(request(b'{"tags": null, "rid": "x"}'), "resume", which) is None
        assert parse_tags(request(b'{"tags": []}'), "release", which) == []
        tags = request(b'{"tags": ["weights"]}', "application/json; charset=utf-8")
        assert parse_tags(tags, "release", which) == ["weights"]
        assert "'type': 'missing', 'loc': ('body',)" in errors(
            parse_tags(request(b""), "release", which)
        )
        assert "json_invalid" in errors(parse_tags(request(b"{bad"), "release", which))
        # Not JSON by its content type: FastAPI validates the raw bytes, and fails.
        assert "b'{}'" in errors(parse_tags(request(b"{}", None), "release", which))
    # upstream 0.5.23: a msgspec struct behind a pydantic schema, two errors each
    message = errors(parse_tags(request(b'{"tags": "weights"}'), "resume", "upstream"))
    assert message.startswith("2 validation errors:")
    assert "is-instance[ResumeMemoryOccupationReqInput]" in message and "list_type" in message
    # the fork: a dataclass, one error
    message = errors(parse_tags(request(b'{"tags": [1]}'), "release", "kt"))
    assert message.startswith("1 validation error:")
    assert "'loc': ('body', 'tags', 0)" in message and "string_type" in message
    assert "dataclass_type" in errors(parse_tags(request(b"null"), "release", "kt"))


def test_memory_knobs() -> None:
    knobs, _ = Knobs.from_env({})
    assert (knobs.release_time, knobs.resume_time) == (0.05, 0.05)
    assert not knobs.resume_fail and not knobs.resume_hang
    env = {
        "KTD_SIM_RELEASE_TIME": "1.5",
        "KTD_SIM_RESUME_TIME": "0",
        "KTD_SIM_RESUME_FAIL": "1",
        "KTD_SIM_RESUME_HANG": "yes",
    }
    knobs, warnings = Knobs.from_env(env)
    assert (knobs.release_time, knobs.resume_time, knobs.resume_fail, knobs.resume_hang) == (
        1.5,
        0.0,
        True,
        True,
    )
    assert warnings == []
    knobs, warnings = Knobs.from_env({"KTD_SIM_RELEASE_TIME": "-1"})
    assert knobs.release_time == 0.05 and len(warnings) == 1


# -- over HTTP


def test_release_and_resume_with_the_saver(sim_factory: Factory) -> None:
    sim = start(
        sim_factory,
        [*SAVER, "--enable-metrics"],
        KTD_SIM_RELEASE_TIME="0.2",
        KTD_SIM_RESUME_TIME="0.05",
    )
    assert info(sim)["memory_occupation"] == "occupied"
    assert sim.record()["memory"]["memory_occupation"] == "occupied"
    assert chat(sim).status_code == 200

    # A generation that arrives during the release waits for it, then meets freed memory.
    t0 = time.monotonic()
    releasing = in_background(lambda: call(sim, RELEASE))
    wait_until(lambda: info(sim)["memory_occupation"] != "occupied", 5, "the release")
    during = chat(sim)
    r = releasing.result(10)
    assert time.monotonic() - t0 >= 0.2  # KTD_SIM_RELEASE_TIME
    assert (r.status_code, r.headers["content-type"], r.text) == (200, "application/json", "null")
    assert during.status_code == 500
    now = info(sim)
    assert now["memory_occupation"] == "released" and now["released_tags"] == ALL
    assert now["offload_tags"] == sorted(ALL) and now["generations_while_released"] == 1

    # Whatever runs the model fails, in its route's error shape, and is counted.
    body = chat(sim).json()
    assert body["object"] == "error" and body["type"] == "InternalServerError"
    assert body["code"] == 500 and "illegal memory access" in body["message"]
    messages = {"model": "m", "max_tokens": 4, "messages": CHAT["messages"]}
    anthropic = httpx.post(sim.url("/v1/messages"), json=messages)
    assert anthropic.status_code == 500 and anthropic.json()["error"]["type"] == "api_error"
    for path, payload in (("/generate", {"text": "hi"}), ("/api/chat", messages)):
        bare = httpx.post(sim.url(path), json=payload)
        assert (bare.status_code, bare.text) == (500, "Internal Server Error")
    broken = httpx.post(sim.url("/v1/completions"), content=b"not json")  # counted all the same
    assert broken.status_code == 500
    for path in ("/health", "/health_generate"):
        assert httpx.get(sim.url(path)).status_code == 503
    assert info(sim)["generations_while_released"] == 8
    assert sim.record()["memory"]["generations_while_released"] == 8
    assert httpx.get(sim.url("/sim/stats")).json()["requests"] == 1  # only the first chat ran
    # What does not run the model still answers.
    for path in ("/v1/models", "/get_model_info", "/v1/loads", "/metrics", "/api/tags"):
        assert httpx.get(sim.url(path)).status_code == 200, path
    tokens = httpx.post(sim.url("/v1/tokenize"), json={"prompt": "a b"})
    assert tokens.status_code == 200

    # GET works too; without a body it is FastAPI's missing body (SGLang's 400).
    missing = httpx.get(sim.url(RESUME))
    assert missing.status_code == 400 and "Field required" in missing.json()["message"]
    t0 = time.monotonic()
    r = httpx.request("GET", sim.url(RESUME), json={"tags": ["weights", "kv_cache"]})
    assert time.monotonic() - t0 >= 0.05  # KTD_SIM_RESUME_TIME
    assert (r.status_code, r.text) == (200, "null")
    partly = info(sim)
    assert partly["memory_occupation"] == "released" and partly["released_tags"] == ["cuda_graph"]
    assert chat(sim).status_code == 500  # the CUDA graphs are still gone
    assert call(sim, RESUME, {"tags": ["cuda_graph"]}).text == "null"
    back = info(sim)
    assert back["memory_occupation"] == "occupied" and back["offload_tags"] == []
    assert back["weights_intact"] and back["generations_while_released"] == 9
    assert chat(sim).status_code == 200 and httpx.get(sim.url("/health")).status_code == 200
    memory = sim.record()["memory"]
    assert memory == {k: back[k] for k in memory} and len(memory) == 5
    log = sim.log()
    assert "sim: release_memory_occupation tags=['kv_cache', 'weights', 'cuda_graph']" in log
    assert "reached released GPU memory (9 so far)" in log


def test_without_the_saver_nothing_is_freed_and_a_resume_too_many_kills(
    sim_factory: Factory,
) -> None:
    sim = start(sim_factory, [])
    for _ in range(2):  # releasing twice is harmless: nothing is paused
        assert call(sim, RELEASE).text == "null"
    now = info(sim)
    assert now["memory_occupation"] == "occupied" and now["released_tags"] == []
    assert now["offload_tags"] == sorted(ALL)  # the scheduler's bookkeeping all the same
    assert chat(sim).status_code == 200 and httpx.get(sim.url("/health")).status_code == 200
    assert call(sim, RESUME).text == "null"
    assert info(sim)["generations_while_released"] == 0
    # Nothing left to resume: the scheduler's offload_tags.remove raises, SGLang dies.
    dies_with_the_server(lambda: call(sim, RESUME))
    assert sim.wait_exit() == -9
    log = sim.log()
    assert "Scheduler hit an exception: Traceback" in log and "KeyError: 'kv_cache'" in log
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log


def test_a_release_with_a_request_in_flight_takes_the_server_down(sim_factory: Factory) -> None:
    sim = start(sim_factory, KTD_SIM_TOKEN_RATE="5")
    slow = {**CHAT, "max_tokens": 100}  # 20 s of tokens: in flight for the whole test
    running = in_background(
        lambda: httpx.post(sim.url("/v1/chat/completions"), json=slow, timeout=30)
    )
    # /v1/loads counts it, as ktd reads it before a release.
    wait_until(
        lambda: httpx.get(sim.url("/v1/loads")).json()["loads"][0]["num_running_reqs"] == 1,
        5,
        "the request in flight",
    )
    dies_with_the_server(lambda: call(sim, RELEASE))
    assert sim.wait_exit() == -9
    with pytest.raises(httpx.TransportError):
        running.result(10)
    log = sim.log()
    assert "AssertionError: release_memory_occupation should be called only when no " in log
    assert "TP0] Scheduler hit an exception" in log


def test_upstream_release_twice_under_the_saver_kills_and_weights_need_a_backup(
    sim_factory: Factory,
) -> None:
    sim = start(
        sim_factory,
        ["--enable-memory-saver", "--disable-cuda-graph"],
        KTD_SIM_SGLANG="upstream",
    )
    # No CUDA graphs: that tag has no memory, releasing it (twice) frees nothing.
    for _ in range(2):
        assert call(sim, RELEASE, {"tags": ["cuda_graph"]}).text == "null"
    assert info(sim)["memory_occupation"] == "occupied"
    # No --enable-weights-cpu-backup: resumed weights are not the weights any more.
    assert call(sim, RELEASE, {"tags": ["weights"]}).text == "null"
    assert info(sim)["released_tags"] == ["weights"]
    assert call(sim, RESUME, {"tags": ["weights"]}).text == "null"
    assert info(sim)["weights_intact"] is False
    assert call(sim, RELEASE, {}).text == "null"
    assert info(sim)["released_tags"] == ["kv_cache", "weights"]
    # Again: torch_memory_saver exit(1)s in the scheduler; upstream's watchdog kills all.
    dies_with_the_server(lambda: call(sim, RELEASE, {"tags": ["weights"]}))
    assert sim.wait_exit() == -9
    log = sim.log()
    assert "Cannot pause allocation that is not active. tag=weights" in log
    assert "crashed with exit code 1. Triggering SIGQUIT for cleanup..." in log


def test_resume_fail_resume_hang_and_the_forks_second_release(sim_factory: Factory) -> None:
    # Both start at once (start-up is most of this test's time).
    failing = start(sim_factory, wait=False, KTD_SIM_RESUME_FAIL="1", KTD_SIM_HEALTH_TIMEOUT="0.1")
    hung = start(sim_factory, wait=False, KTD_SIM_RESUME_HANG="1", KTD_SIM_HEALTH_TIMEOUT="0.1")
    failing.wait_ready()
    hung.wait_ready()
    assert call(failing, RELEASE).text == "null"
    for _ in range(2):  # it stays released: every resume fails alike
        r = call(failing, RESUME)
        assert r.status_code == 400 and "KTD_SIM_RESUME_FAIL" in r.json()["error"]["message"]
        assert info(failing)["memory_occupation"] == "released"
    assert chat(failing).status_code == 500 and info(failing)["generations_while_released"] == 1
    # Released twice under the saver: torch_memory_saver exit(1)s in the scheduler, and the
    # fork has no watchdog: the server lives on with no scheduler, and nothing answers.
    with pytest.raises(httpx.TimeoutException):
        call(failing, RELEASE, timeout=0.3)
    assert httpx.get(failing.url("/health")).status_code == 503  # after its timeout
    assert httpx.get(failing.url("/v1/models")).status_code == 200
    assert failing.proc.poll() is None and "Cannot pause allocation" in failing.log()

    assert call(hung, RELEASE).text == "null"
    with pytest.raises(httpx.TimeoutException):
        call(hung, RESUME, timeout=0.3)
    assert info(hung)["memory_occupation"] == "resuming"  # for good
    with pytest.raises(httpx.TimeoutException):  # generations wait for the scheduler
        chat(hung, timeout=0.2)
    assert httpx.get(hung.url("/health")).status_code == 503
    assert info(hung)["generations_while_released"] == 0
    assert "KTD_SIM_RESUME_HANG" in hung.log()


def test_cuda_graphs_are_freed_only_when_captured_under_the_saver(sim_factory: Factory) -> None:
    """Issue 40: without ``SGLANG_MEMORY_SAVER_CUDA_GRAPH`` SGLang captures its CUDA graphs
    outside the saver; released, ``cuda_graph`` frees nothing (the tag is still noted,
    so a resume of it is no KeyError)."""
    sim = start(sim_factory, SGLANG_MEMORY_SAVER_CUDA_GRAPH="0")
    assert call(sim, RELEASE).text == "null"
    state = info(sim)
    assert (
        state["released_tags"] == ["kv_cache", "weights"] and "cuda_graph" in state["offload_tags"]
    )
    assert call(sim, RESUME).text == "null" and info(sim)["memory_occupation"] == "occupied"
