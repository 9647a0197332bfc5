"""Sleep and wake end to end: a real ``ktd serve`` and sim engines that serve SGLang's
memory API (``/release_memory_occupation``, ``/resume_memory_occupation``), die when
released with a request in flight, and count any generation sent while released."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ConfigWriter, engine_auth, sim_model, wait_for
from tests.fixtures.topology import smi_engines_script
from tests.stack import Stack, StackFactory


def state(c: Any, alias: str) -> str:
    return str(c.status(alias)[0].state)


def server_info(port: int) -> dict[str, Any]:
    r = httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=5, headers=engine_auth(port))
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def sleepy(alias: str, **over: Any) -> dict[str, Any]:
    """A sleep-enabled sim model on NUMA node 0 (this box has one: only one is awake)."""
    return sim_model(alias, numa=[0], sleep=True, **over)


# One daemon for the tests that neither kill, restart nor reconfigure it at start: each
# has models of its own (a counter such as ``loads`` is then the test's alone).
SHARED_MODELS = [
    sleepy("a-kt"),
    sleepy("b-kt"),
    sleepy("s-kt"),
    sim_model("plain-kt"),
    sleepy("f-kt", env={"KTD_SIM_RESUME_FAIL": 1}),
    sleepy("t-kt", ttl=0.5, sleep_ttl=1.5),
    sim_model("race-kt"),
    sleepy("p-kt", env={"KTD_SIM_SGLANG": "upstream", "KTD_SIM_PREFILL_TIME": 4}),
    sleepy("adm-kt", kt={"extra_args": ["--admin-api-key", "ops-secret"]}),
    sleepy("w-kt"),
]


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    return stack_factory(SHARED_MODELS, with_frontend=False)


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


def test_a_swap_puts_the_holder_to_sleep_and_a_request_wakes_it_in_place(stack: Stack) -> None:
    d = stack.daemon
    with d.client(timeout=60) as c:
        a = c.load("a-kt")
        assert a.sleep == "on" and "--enable-memory-saver" in a.argv
        b = c.load("b-kt")  # needs node 0: a-kt sleeps instead of stopping
        asleep = c.status("a-kt")[0]
        assert asleep.state == "asleep" and asleep.pid == a.pid and asleep.asleep_since
        assert asleep.reason is None or "b-kt" in (asleep.reason or "")
        info = server_info(a.port)
        assert info["memory_occupation"] == "released"
        # A lease on the asleep model wakes it (the same process: no reload) and puts
        # b-kt to sleep in turn.
        lease = c.acquire("a-kt", "t")
        woke = c.status("a-kt")[0]
        assert woke.state == "ready" and woke.pid == a.pid and woke.loads == 1
        assert state(c, "b-kt") == "asleep"
        c.release(lease.lease)
        for port in (a.port, b.port):
            assert server_info(port)["generations_while_released"] == 0
        log = d.ktctl("logs", "a-kt", "-n", "500").stdout
        assert "asleep: GPU memory released" in log and "awake" in log


def test_ktctl_sleep_and_wake_and_a_model_without_sleep(stack: Stack) -> None:
    d = stack.daemon
    with d.client(timeout=60) as c:
        c.load("s-kt")
        r = d.ktctl("sleep", "--json", "s-kt")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["engine"]["state"] == "asleep"
        r = d.ktctl("wake", "s-kt")
        assert r.returncode == 0, r.stderr
        assert state(c, "s-kt") == "ready"
        r = d.ktctl("wake", "s-kt")  # a ready model: a no-op
        assert r.returncode == 0, r.stderr
        c.load("plain-kt")
        r = d.ktctl("sleep", "plain-kt")
        assert r.returncode == 1 and "sleep" in r.stderr, r.stderr
        assert state(c, "plain-kt") == "ready"


def test_a_wake_whose_resume_fails_stops_it_says_why_and_the_next_load_is_cold(
    stack: Stack,
) -> None:
    from ktctl import KtdError

    d = stack.daemon
    with d.client(timeout=60) as c:
        first = c.load("f-kt")
        c.sleep("f-kt")
        with pytest.raises(KtdError) as err:
            c.wake("f-kt")
        assert err.value.code == "load_failed" and "wake failed" in err.value.message
        assert state(c, "f-kt") == "stopped"
        again = c.load("f-kt")  # a fresh process
        assert again.pid != first.pid and again.state == "ready"


def test_the_idle_ttl_puts_it_to_sleep_and_the_sleep_ttl_stops_it(stack: Stack) -> None:
    d = stack.daemon
    with d.client(timeout=60) as c:
        c.load("t-kt")
        wait_for(lambda: state(c, "t-kt") == "asleep", timeout=20, what="ttl sleep")
        wait_for(lambda: state(c, "t-kt") == "stopped", timeout=20, what="sleep_ttl stop")
        assert "sleep_ttl" in "\n".join(c.logs("t-kt", 100))


def test_kill9_of_ktd_readopts_an_asleep_engine_asleep_and_unprobed(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    cfg = write_config([sleepy("k-kt")], daemon={"health_interval": 0.2})
    d1 = daemon_factory(cfg)
    with d1.client(timeout=60) as c:
        before = c.load("k-kt")
        c.sleep("k-kt")
    d1.stop(signal.SIGKILL)
    d2 = daemon_factory(cfg)
    with d2.client(timeout=60) as c:
        now = wait_for(lambda: (s := c.status("k-kt")[0]).state == "asleep" and s, what="adopted")
        assert now.pid == before.pid
        assert server_info(before.port)["generations_while_released"] == 0
        lease = c.acquire("k-kt", "t")  # woken by demand
        assert state(c, "k-kt") == "ready" and c.status("k-kt")[0].pid == before.pid
        c.release(lease.lease)
        assert server_info(before.port)["generations_while_released"] == 0


def test_an_evict_a_load_overtakes_answers_at_once_saying_so(stack: Stack) -> None:
    """Issue 31, item 3: ``evict m`` and ``load m`` sent together: the load answered
    ready at once and the evict never answered. Both now answer at once: the load ready,
    the evict ``busy`` saying a load overtook it (or, if the stop had begun, evicted)."""
    import msgspec
    import zmq

    d = stack.daemon
    with d.client(timeout=60) as c:
        c.load("race-kt")
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"ipc://{d.socket}")
    try:
        s.send(msgspec.msgpack.encode({"op": "evict", "id": 1, "alias": "race-kt"}))
        s.send(msgspec.msgpack.encode({"op": "load", "id": 2, "alias": "race-kt"}))
        replies: dict[int, dict[str, Any]] = {}
        poller = zmq.Poller()
        poller.register(s, zmq.POLLIN)
        while len(replies) < 2 and poller.poll(30_000):
            r = msgspec.msgpack.decode(s.recv())
            replies[r["id"]] = r
    finally:
        s.close()
    assert set(replies) == {1, 2}, replies  # neither waits for ever
    assert replies[2]["type"] == "load" and replies[2]["engine"]["state"] == "ready"
    evict = replies[1]
    if evict["type"] == "error":
        assert evict["code"] == "busy" and "overtaken by a load" in evict["message"]
    else:
        assert evict["type"] == "evict" and evict["evicted"] == ["race-kt"]


def test_a_reload_or_a_shutdown_stops_an_asleep_engine_without_a_wake(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """A changed launch (a reload) and ktd's SIGTERM stop an asleep engine as it is:
    no resume, no generation; the reload's new launch is a cold load on demand."""
    from tests.reliability._util import engine_procs

    d = daemon_factory(write_config([sleepy("r-kt")]))
    with d.client(timeout=60) as c:
        first = c.load("r-kt")
        c.sleep("r-kt")
        write_config([sleepy("r-kt", kt={"ctx": 2048})])
        c.reload()
        wait_for(lambda: state(c, "r-kt") == "stopped", timeout=20, what="stopped by the reload")
        log = "\n".join(c.logs("r-kt", 300))
        assert "resum" not in log.split("asleep: GPU memory released")[-1]
        again = c.load("r-kt")
        assert again.pid != first.pid and "2048" in again.argv
        c.sleep("r-kt")
        port = again.port
    assert server_info(port)["generations_while_released"] == 0
    assert d.stop(signal.SIGTERM) == 0
    assert "Traceback" not in d.output()
    assert not engine_procs()


def test_a_request_the_load_count_misses_never_meets_a_release(stack: Stack) -> None:
    """Issue 40: upstream SGLang's ``/v1/loads`` shows a request only once its prefill has
    ended, and a release with it in the scheduler takes the server down. A request ktd
    never saw (straight to the engine: a router's, a client that kept the key) in a long
    prefill: ktd closes SGLang's door, the request is aborted there, the scheduler proves
    idle, then the release. (Before: one zero reading, the release, the server dead.)"""
    d = stack.daemon
    with d.client(timeout=60) as c:
        e = c.load("p-kt")
        base = f"http://127.0.0.1:{e.port}"
        answer: list[httpx.Response] = []

        def straggler() -> None:
            body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
            answer.append(
                httpx.post(base + "/generate", json=body, headers=engine_auth(e.port), timeout=60)
            )

        t = threading.Thread(target=straggler)
        t.start()
        try:
            wait_for(lambda: httpx.get(base + "/sim/stats").json()["active"] == 1, what="in")
            loads = httpx.get(base + "/v1/loads", headers=engine_auth(e.port)).json()
            assert loads["loads"][0]["num_running_reqs"] == 0  # invisible in its prefill
            asleep = c.sleep("p-kt", timeout=30)
        finally:
            t.join(30)
        assert asleep.state == "asleep" and asleep.pid == e.pid
        info = server_info(e.port)
        assert info["memory_occupation"] == "released" and info["door"] == "closed"
        assert not info["scheduler_spinning"] and info["generations_while_released"] == 0
        assert answer and answer[0].status_code == 500  # aborted at the closed door
        woke = c.load("p-kt")
        assert woke.pid == e.pid and server_info(e.port)["door"] == "open"


def test_a_ktd_killed_during_the_release_adopts_the_engine_asleep_and_never_probes_it(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    """Issue 40: the record says "releasing" before the release call, so a ktd restarted
    between the call and its answer adopts the engine asleep, never probes it with a
    generation (the release may have freed its memory), and loads it afresh when wanted
    (a resume of memory that was never released would take SGLang down as surely)."""
    d = daemon_factory(write_config([sleepy("r-kt", env={"KTD_SIM_RELEASE_TIME": 3})]))
    c = d.client(timeout=60)
    e = c.load("r-kt")
    t = threading.Thread(target=lambda: d.ktctl("sleep", "r-kt"))
    t.start()
    wait_for(lambda: server_info(e.port)["memory_occupation"] == "releasing", what="release")
    c.close()
    d.proc.kill()
    d.proc.wait()
    t.join(30)
    d.start()
    with d.client(timeout=60) as c:
        wait_for(lambda: state(c, "r-kt") == "asleep", timeout=30, what="adopted asleep")
        wait_for(lambda: server_info(e.port)["memory_occupation"] == "released", what="done")
        assert server_info(e.port)["generations_while_released"] == 0
        again = c.load("r-kt")
        assert again.state == "ready" and again.pid != e.pid  # loaded afresh
        log = d.ktctl("logs", "r-kt", "-n", "200").stdout
        assert "cannot know" in log


def test_a_users_admin_key_is_carried_to_the_sleep_calls_and_kept_off_the_command_line(
    stack: Stack,
) -> None:
    """Issue 40: with ``--admin-api-key`` SGLang's admin-level routes (release, resume,
    the fence's pause, flush and continue) want that key alone: a sleep answered 401 and
    the engine was stopped. ktd carries the user's admin key, from the 0600 key file."""
    d = stack.daemon
    with d.client(timeout=60) as c:
        e = c.load("adm-kt")
        assert "ops-secret" not in " ".join(e.argv)
        asleep = c.sleep("adm-kt", timeout=30)
        assert asleep.state == "asleep" and asleep.pid == e.pid
        woke = c.wake("adm-kt", timeout=30)
        assert woke.state == "ready" and woke.pid == e.pid
        assert "ops-secret" not in "\n".join(c.logs("adm-kt", 500))


def test_a_lease_holders_key_cannot_release_resume_or_open_the_door(stack: Stack) -> None:
    """Issue 40: lease clients keep the engine's URL and key after their lease ends. ktd
    withholds what they could misuse: the engine runs with an admin key of ktd's own (in
    its 0600 key file), which SGLang's release, resume, pause, flush and continue want;
    the key a lease carries is for generations, which wait at the closed door while the
    engine sleeps."""
    d = stack.daemon
    with d.client(timeout=60) as c:
        lease = c.acquire("w-kt", "a-tool")
        base, key = lease.url, lease.api_key
        c.release(lease.lease)
        assert key
        auth = {"Authorization": f"Bearer {key}"}
        for path in ("/release_memory_occupation", "/pause_generation", "/continue_generation"):
            r = httpx.post(base + path, json={"tags": None}, headers=auth, timeout=10)
            assert r.status_code == 401, (path, r.status_code)
        assert httpx.get(base + "/v1/models", headers=auth, timeout=10).status_code == 200
        asleep = c.sleep("w-kt", timeout=30)  # ktd's own calls carry its admin key
        assert asleep.state == "asleep"
        later = httpx.post(base + "/resume_memory_occupation", json={"tags": None}, headers=auth)
        assert (
            later.status_code == 401 and server_info(asleep.port)["memory_occupation"] == "released"
        )


def test_sleep_verify_measures_each_step_and_the_residue_is_recorded(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str], tmp_path: Path
) -> None:
    """``ktctl sleep --verify``: the GPU box's one command (issue 40). Here a fake
    nvidia-smi says each engine process holds 1 GiB on GPU 0 (a real one answers per
    process too): after the release ktd records the residue, in the engine's log and in
    every later fit, and the verify prints where the memory was at each step."""
    smi = smi_engines_script(tmp_path / "nvidia-smi", [(0, "G", 81920, 4096)], 1024)
    d = daemon_factory(write_config([sleepy("v-kt")]), env={**ktd_env, "KTD_NVIDIA_SMI": str(smi)})
    r = d.ktctl("sleep", "--verify", "v-kt")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "v-kt: slept in" in out and "woke in" in out
    assert "GPU 0 (nvidia-smi)" in out and "host, NUMA node 0" in out
    assert "the sleep freed" in out and "SGLang: weights" in out
    log = d.ktctl("logs", "v-kt", "-n", "200").stdout
    assert "asleep, still held on its GPUs: GPU 0:" in log
    doc = json.loads(d.ktctl("sleep", "--verify", "--json", "v-kt").stdout)
    assert doc["asleep"]["state"] == "asleep" and doc["awake_again"]["state"] == "ready"
    assert doc["asleep"]["residue"] and doc["asleep"]["residue"][0]["gpu"] == 0
    assert doc["awake"]["pid"] == doc["awake_again"]["pid"]
