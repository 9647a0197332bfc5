"""The sim's door (``ktd/sim/door.py``) and its load snapshot, as SGLang serves them.

Why: ktd's sleep fence closes SGLang's door (``/pause_generation``, ``abort`` mode),
asks the scheduler to prove itself idle (``/flush_cache``) and reads ``/v1/loads``; a
wake opens the door again (``/continue_generation``). ktd's tests meet these through the
sim, so the sim must hold what SGLang holds (generations and ``/health``'s token wait at
the closed door), abort what SGLang aborts, and show in ``/v1/loads`` only what SGLang
shows (upstream: a snapshot published after a prefill, every 15 decode steps and when
idle). Every sim is a real process; no assertion rests on a timing margin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import httpx

from tests.sim.simharness import SimProc, wait_until
from tests.sim.test_memory import CHAT, FAST, SAVER, in_background, info

Factory = Callable[..., SimProc]
GEN = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}


def start(factory: Factory, **env: str) -> SimProc:
    sim = factory(args=SAVER, env={**FAST, **env})
    sim.wait_ready()
    return sim


def active(sim: SimProc) -> int:
    n: int = httpx.get(sim.url("/sim/stats"), timeout=5).json()["active"]
    return n


def loads(sim: SimProc) -> dict[str, float]:
    entry: dict[str, float] = httpx.get(sim.url("/v1/loads"), timeout=5).json()["loads"][0]
    return entry


def test_upstream_shows_a_request_only_after_its_prefill(sim_factory: Factory) -> None:
    sim = start(sim_factory, KTD_SIM_SGLANG="upstream", KTD_SIM_PREFILL_TIME="2")
    before = loads(sim)
    answer = in_background(lambda: httpx.post(sim.url("/generate"), json=GEN, timeout=30))
    wait_until(lambda: active(sim) == 1, 10, "the request in")
    during = loads(sim)  # the idle snapshot from before it came
    assert during["num_running_reqs"] == 0 and during["num_used_tokens"] == 0
    assert during["timestamp"] == before["timestamp"]
    assert answer.result().status_code == 200
    after = loads(sim)
    assert after["num_running_reqs"] == 0 and after["timestamp"] > before["timestamp"]


def test_the_fork_counts_between_batches(sim_factory: Factory) -> None:
    sim = start(sim_factory, KTD_SIM_SGLANG="kt", KTD_SIM_PREFILL_TIME="2")
    answer = in_background(lambda: httpx.post(sim.url("/generate"), json=GEN, timeout=30))
    wait_until(lambda: active(sim) == 1, 10, "the request in")
    assert loads(sim)["num_used_tokens"] > 0
    assert answer.result().status_code == 200


def test_the_closed_door_holds_generations_and_health_and_aborts_what_is_in(
    sim_factory: Factory,
) -> None:
    sim = start(sim_factory, KTD_SIM_PREFILL_TIME="60", KTD_SIM_HEALTH_TIMEOUT="1")
    inside = in_background(lambda: httpx.post(sim.url("/generate"), json=GEN, timeout=60))
    wait_until(lambda: active(sim) == 1, 10, "the request in")
    r = httpx.post(sim.url("/pause_generation"), json={"mode": "abort"}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert inside.result().status_code == 500 and active(sim) == 0  # aborted, mid-prefill
    assert info(sim)["door"] == "closed" and not info(sim)["scheduler_spinning"]
    assert httpx.get(sim.url("/health"), timeout=10).status_code == 503  # gave up waiting
    held = in_background(lambda: httpx.post(sim.url("/v1/chat/completions"), json=CHAT, timeout=60))
    wait_until(lambda: info(sim)["held_at_door"] == 1, 10, "held at the door")
    assert active(sim) == 0  # not in the scheduler
    assert httpx.get(sim.url("/flush_cache"), timeout=5).status_code == 200
    r = httpx.post(sim.url("/continue_generation"), json={}, timeout=5)
    assert r.status_code == 200 and info(sim)["door"] == "open"
    # Through the door: in the scheduler now (its minute of prefill is the sim's to end).
    wait_until(lambda: active(sim) == 1 and info(sim)["held_at_door"] == 0, 10, "let in")
    sim.kill()
    with contextlib.suppress(httpx.HTTPError):
        held.result()


def test_flush_answers_400_while_anything_runs(sim_factory: Factory) -> None:
    sim = start(sim_factory, KTD_SIM_PREFILL_TIME="2")
    answer = in_background(lambda: httpx.post(sim.url("/generate"), json=GEN, timeout=30))
    wait_until(lambda: active(sim) == 1, 10, "the request in")
    assert httpx.post(sim.url("/flush_cache"), timeout=5).status_code == 400
    answer.result()
    assert httpx.post(sim.url("/flush_cache"), timeout=5).status_code == 200


def test_the_scheduler_pauses_of_retract_and_in_place_spin(sim_factory: Factory) -> None:
    sim = start(sim_factory)
    for mode in ("retract", "in_place"):
        assert httpx.post(sim.url("/pause_generation"), json={"mode": mode}).status_code == 200
        assert info(sim)["scheduler_spinning"]
        assert httpx.post(sim.url("/continue_generation"), json={}).status_code == 200
        assert not info(sim)["scheduler_spinning"]
    bad = httpx.post(sim.url("/pause_generation"), json={"mode": "nap"})
    assert bad.status_code == 400 and "literal_error" in bad.text
    assert httpx.post(sim.url("/continue_generation")).status_code == 400  # body required


def test_an_sglang_without_the_door_answers_404_to_it(sim_factory: Factory) -> None:
    """``KTD_SIM_NO_DOOR``: an SGLang from before ``/pause_generation`` (issue 43, item 12),
    which ktd's sleep fences on zero readings alone, or stops instead."""
    sim = start(sim_factory, KTD_SIM_NO_DOOR="1")
    for path in ("/pause_generation", "/continue_generation"):
        r = httpx.post(sim.url(path), json={"mode": "abort"}, timeout=5)
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    assert httpx.post(sim.url("/flush_cache"), timeout=5).status_code == 200


def test_an_admin_key_guards_the_admin_routes_and_only_them(sim_factory: Factory) -> None:
    sim = sim_factory(
        args=[*SAVER, "--api-key", "user-key", "--admin-api-key", "admin-key"], env=FAST
    )
    sim.wait_ready()
    user = {"Authorization": "Bearer user-key"}
    admin = {"Authorization": "Bearer admin-key"}
    for path in ("/flush_cache", "/release_memory_occupation"):
        assert httpx.post(sim.url(path), json={}, headers=user).status_code == 401
    assert httpx.post(sim.url("/flush_cache"), headers=admin).status_code == 200
    assert httpx.get(sim.url("/v1/models"), headers=user).status_code == 200
    assert httpx.get(sim.url("/v1/models"), headers=admin).status_code == 401
