"""Queue, don't refuse: swaps wait for the busy holder, admission limits, failed-engine retry.

Real ``ktd serve`` + ``ktd frontend`` + sim engines. Nothing here depends on a
timing margin: the slow stream holding an engine is paced far slower than the
test, and it ends only when the test hangs up; everything else is ordered by
cause and effect (a comment seen, a queue depth in ``ktctl status``).
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from tests.conftest import sim_model, wait_for

CHAT: Any = [{"role": "user", "content": "hi"}]
SLOW = {"KTD_SIM_TOKEN_RATE": 2}  # a 1,000-token stream outlives any test


def status(daemon: Any) -> dict[str, dict[str, Any]]:
    return daemon.engines()  # type: ignore[no-any-return]


def start(
    write_config: Any, daemon_factory: Any, frontend_factory: Any, models: Any, **daemon: Any
) -> tuple[Any, Any]:
    cfg = write_config(models, daemon=daemon or None)
    return daemon_factory(cfg), frontend_factory(cfg)


async def first_event(lines: Any) -> str:
    """The stream's first line of the engine's: the load's progress (comments, and the
    ``ktd.progress`` events with their data lines) passed over."""
    progress = False
    async for line in lines:
        if line.startswith("event: ktd.progress"):
            progress = True
        elif progress and line.startswith("data: "):
            progress = False
        elif line.strip() and not line.startswith(":"):
            return str(line)
    raise AssertionError("stream ended")


def test_swap_waits_for_the_busy_holder_in_arrival_order(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    # One NUMA node on this machine: a and b cannot run at once.
    daemon, fe = start(
        write_config,
        daemon_factory,
        frontend_factory,
        [sim_model("a", numa=[0], env=SLOW), sim_model("b", numa=[0])],
    )
    order: list[str] = []

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fe.url, timeout=60) as c:
            hold = {"model": "a", "messages": CHAT, "max_tokens": 1000, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=hold) as held:
                lines = held.aiter_lines()
                assert (await first_event(lines)).startswith("data: {")  # a is busy
                got_b: list[str] = []
                b_waiting = trio.Event()

                async def want_b() -> None:
                    body = {"model": "b", "messages": CHAT, "max_tokens": 2, "stream": True}
                    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200
                        async for line in r.aiter_lines():
                            if line.startswith(": waiting for a"):
                                b_waiting.set()
                            if line.strip():
                                got_b.append(line)
                    order.append("b")

                async def want_a_again() -> None:
                    # Arrives after b queued: must not jump ahead by grabbing a.
                    body = {"model": "a", "messages": CHAT, "max_tokens": 1}
                    r = await c.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
                    order.append("a-again")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(want_b)
                    await b_waiting.wait()
                    assert status(daemon)["a"]["state"] == "ready"  # not refused, not evicted
                    nursery.start_soon(want_a_again)
                    await trio.to_thread.run_sync(
                        lambda: wait_for(
                            lambda: status(daemon)["a"]["queued"] == 1,
                            what="a-again queued behind the swap",
                        )
                    )
                    order.append("hang-up")
                    await held.aclose()  # a is idle now: the swap may happen
            assert [ln for ln in got_b if ln.startswith("data: {")]
            assert got_b[-1] == "data: [DONE]"

    trio.run(main)
    assert order == ["hang-up", "b", "a-again"]
    engines = status(daemon)
    assert engines["a"]["evictions"] == 1 and engines["b"]["evictions"] == 1
    assert engines["a"]["state"] == "ready" and engines["b"]["state"] == "stopped"


def test_admission_limits_answer_429_with_retry_after(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    daemon, fe = start(
        write_config,
        daemon_factory,
        frontend_factory,
        [sim_model("m", env=SLOW, max_concurrent=1, max_queue=1)],
    )

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fe.url, timeout=60) as c:
            hold = {"model": "m", "messages": CHAT, "max_tokens": 1000, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=hold) as held:
                # Keep the iterator: one dropped here would close the stream at once.
                lines = held.aiter_lines()
                assert (await first_event(lines)).startswith("data: {")
                result: list[int] = []

                async def queued() -> None:
                    body = {"model": "m", "messages": CHAT, "max_tokens": 1}
                    result.append((await c.post("/v1/chat/completions", json=body)).status_code)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(queued)
                    await trio.to_thread.run_sync(
                        lambda: wait_for(
                            lambda: status(daemon)["m"]["queued"] == 1, what="second request queued"
                        )
                    )
                    over = await c.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": CHAT, "max_tokens": 1},
                    )
                    assert over.status_code == 429, over.text
                    assert int(over.headers["retry-after"]) >= 1
                    err = over.json()["error"]
                    assert set(err) == {"message", "type", "param", "code"}
                    assert err["code"] == "queue_full" and "max_queue 1" in err["message"]
                    # A stream over the limit gets the real 429 too, not a 200.
                    s = await c.post("/v1/chat/completions", json={**hold, "max_tokens": 1})
                    assert s.status_code == 429
                    await held.aclose()
                assert result == [200]

    trio.run(main)


def test_a_failed_engine_is_retried_by_a_request_after_its_backoff(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    crash = [sim_model("m", env={"KTD_SIM_CRASH_DURING_LOAD": 1})]
    daemon, fe = start(write_config, daemon_factory, frontend_factory, crash, restart_backoff=200)
    body = {"model": "m", "messages": CHAT, "max_tokens": 1}
    with httpx.Client(base_url=fe.url, timeout=60) as c:
        first = c.post("/v1/chat/completions", json=body)
        assert first.status_code == 503 and first.json()["error"]["code"] == "engine_failed"
        again = c.post("/v1/chat/completions", json=body)
        assert again.status_code == 503, again.text
        assert int(again.headers["retry-after"]) > 100  # the backoff, not a retry storm
        m = status(daemon)["m"]
        assert m["state"] == "failed" and m["failures"] == 1 and m["retry_in"] > 100
        # Fixed config, short backoff: the next request after it retries the load.
        write_config([sim_model("m")], daemon={"restart_backoff": 0.01})
        assert daemon.ktctl("reload").returncode == 0
        wait_for(lambda: status(daemon)["m"]["retry_in"] == 0, what="backoff over")
        ok = c.post("/v1/chat/completions", json=body)
        assert ok.status_code == 200, ok.text
    m = status(daemon)["m"]
    assert m["state"] == "ready" and m["failures"] == 0 and m["loads"] == 1


def test_max_queue_0_loads_a_cold_model_after_an_evict_as_on_a_fresh_frontend(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    """Regression: after one evict, every request got 429 "0 request(s) already waiting"
    for as long as the frontend ran. ``max_queue: 0`` means no request waits behind
    another; the request that finds the model cold loads it, fresh or after an evict."""
    models = [sim_model("m", max_queue=0)]
    daemon, fe = start(write_config, daemon_factory, frontend_factory, models)
    body = {"model": "m", "messages": CHAT, "max_tokens": 1}
    with httpx.Client(base_url=fe.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        for _ in range(2):
            assert daemon.ktctl("evict", "m").returncode == 0
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
    assert status(daemon)["m"]["loads"] == 3
