"""What a key is charged and what it may see, through the real daemon, frontend and sim
(issue 43, items 3, 4, 5 and 10), with the official clients where they fit.

* A stream the client hangs up on is charged the tokens it received (OpenAI with and
  without ``include_usage``, Anthropic, Ollama), its engine request is aborted, and the
  ledger counts it as cut.
* ``tokens_per_day`` holds under concurrency: a request reserves its ``max_tokens`` (and
  its prompt's estimate) at admission; twenty at once against a day of 300 are served at
  most one request past it, the rest get 429 with ``Retry-After``.
* A request waiting for a load that an evict ends gets 503 ``engine_failed`` with
  ``Retry-After``.
* A key scoped to one model sees only that model's engine in ``/server_info``,
  ``/model_info`` and ``/get_load``.

One shared stack (``tests/stack.py``): the ``held`` engine's streams send their first
token and wait for the test's gate (``KTD_SIM_HOLD``), so a stream is cut, or twenty run
at once, exactly when the test says; each test spends only its own keys.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
import trio

from tests.conftest import DaemonProc, sim_model, wait_for
from tests.frontend.conftest import launch_frontend
from tests.stack import Stack, StackFactory

SCOPED = "sk-scoped-to-m1"
WATCHER = "sk-sees-everything"
#: Two keys of 300 tokens a day, one per test that spends a day.
DAILY = {"daily": "sk-daily-300", "shared": "sk-daily-300-two-frontends"}
CUT = {api: f"sk-cut-{api}" for api in ("openai", "usage", "anthropic", "ollama")}
KEYS = [
    {"name": "scoped", "key": SCOPED, "models": ["m1"]},
    {"name": "watcher", "key": WATCHER},
    *({"name": name, "key": key, "tokens_per_day": 300} for name, key in DAILY.items()),
    *({"name": f"cut-{api}", "key": key} for api, key in CUT.items()),
]
HI = [{"role": "user", "content": "hi"}]
HELD = {"KTD_SIM_HOLD": 1}


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    models = [
        sim_model("m1"),
        sim_model("held", env=HELD),
        sim_model("slow", env={"KTD_SIM_LOAD_TIME": 30}),
    ]
    # lease_ttl 3: the frontend reports (and hands the ledger its counts) every second.
    return stack_factory(models, daemon={"lease_ttl": 3}, frontend={"keys": KEYS})


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


def port_of(daemon: DaemonProc, alias: str) -> int:
    return int(daemon.engines()[alias]["port"])


def sim_stats(daemon: DaemonProc, alias: str) -> dict[str, Any]:
    r = httpx.get(f"http://127.0.0.1:{port_of(daemon, alias)}/sim/stats", timeout=10)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def open_gate(daemon: DaemonProc, alias: str = "held") -> None:
    port = port_of(daemon, alias)
    r = httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}, timeout=10)
    r.raise_for_status()


def wait_row(daemon: DaemonProc, key: str, model: str) -> dict[str, Any] | None:
    """``key``'s ledger row for ``model``, once the frontend's report brought it."""
    wait_for(lambda: ledger_row(daemon, key, model) is not None, what=f"{key} counted")
    return ledger_row(daemon, key, model)


def ledger_row(daemon: DaemonProc, key: str, model: str) -> dict[str, Any] | None:
    res = daemon.ktctl("usage", "--json", "--key", key)
    assert res.returncode == 0, res.stderr
    rows = [r for r in json.loads(res.stdout)["usage"] if r["model"] == model]
    return rows[0] if rows else None


def _content(event: str) -> str:
    """The text of one chat chunk."""
    choices = json.loads(event).get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


def first_token_then_hang_up(url: str, api: str) -> None:
    """One streamed request of key ``CUT[api]`` to ``held``: read until its first token
    (all the held engine sends), then close the stream, in the client's own way."""
    key = CUT[api]
    if api in ("openai", "usage"):
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
        more: dict[str, Any] = {}
        if api == "usage":
            more["stream_options"] = {"include_usage": True}
        stream = client.chat.completions.create(
            model="held", messages=HI, max_tokens=50, stream=True, **more
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
    elif api == "anthropic":
        claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)
        events = claude.messages.create(
            model="held",
            max_tokens=50,
            messages=HI,  # type: ignore[arg-type]
            stream=True,
        )
        for event in events:
            if event.type == "content_block_delta":
                break
        events.close()
    else:
        llama = ollama.Client(host=url, headers={"authorization": f"Bearer {key}"}, timeout=30)
        lines = llama.chat(model="held", messages=HI, stream=True, options={"num_predict": 50})
        for line in lines:
            if line.message.content:
                break
        lines.close()


def test_a_stream_the_client_hangs_up_on_is_charged_what_it_received_and_aborted(
    stack: Stack,
) -> None:
    url, daemon = stack.url, stack.daemon
    assert daemon.ktctl("load", "held").returncode == 0
    for api in CUT:
        first_token_then_hang_up(url, api)
    # The engine's requests were aborted (the frontend closed their connections).
    wait_for(
        lambda: (lambda s: s["aborted"] == len(CUT) and s["active"] == 0)(
            sim_stats(daemon, "held")
        ),
        what="every cut stream aborted at the engine",
    )
    # Each is charged the one token its client received, and counted as cut.
    for api in CUT:
        name = f"cut-{api}"
        row = wait_row(daemon, name, "held")
        assert row is not None
        assert (row["requests"], row["completion"], row["errors"]) == (1, 1, 0), (api, row)
        assert row.get("cut") == 1, (api, row)
    # Anthropic's message_start said the prompt: the engine's own figure is kept.
    anthropic_row = ledger_row(daemon, "cut-anthropic", "held")
    assert anthropic_row is not None and anthropic_row["prompt"] > 0


class Burst:
    """Streams of one of the ``DAILY`` keys to ``held`` (``max_tokens`` 50) sent at once:
    what each was served, or its refusal."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.served: list[int] = []
        self.refused: list[httpx.Response] = []
        self.answered = trio.Semaphore(0)  # one per request refused or running

    async def one(self, c: httpx.AsyncClient) -> None:
        body = {"model": "held", "messages": HI, "max_tokens": 50, "stream": True}
        headers = {"authorization": f"Bearer {DAILY[self.key]}"}
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                self.refused.append(r)
                self.answered.release()
                return
            tokens = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {") and _content(line[6:]):
                    tokens += 1
                    if tokens == 1:
                        self.answered.release()
            self.served.append(tokens)

    async def send(self, nursery: trio.Nursery, c: httpx.AsyncClient, n: int) -> None:
        """``n`` requests at once; returns when each is refused or running."""
        for _ in range(n):
            nursery.start_soon(self.one, c)
        for _ in range(n):
            await self.answered.acquire()

    def check(self, daemon: DaemonProc, total: int) -> int:
        """The refusals' shape, and the day's tokens in the ledger (returned): at most one
        request's worth past 300."""
        served, refused = self.served, self.refused
        assert len(served) + len(refused) == total
        assert served and all(n == 50 for n in served)
        for r in refused:
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
            assert r.json()["error"]["code"] == "key_tokens_reserved"
        wait_for(
            lambda: (ledger_row(daemon, self.key, "held") or {}).get("requests") == len(served),
            what="the served requests in the ledger",
        )
        row = ledger_row(daemon, self.key, "held")
        assert row is not None
        spent = int(row["prompt"] + row["completion"])
        assert spent <= 300 + spent // len(served), (len(served), row)
        return spent


def held_elsewhere(url: str, key: str) -> float:
    """What the other frontends hold of ``key``'s day, as this one's /metrics says."""
    text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {WATCHER}"}).text
    line = f'ktd_key_tokens_held{{key="{key}",where="others"}} '
    found = [float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


def test_tokens_per_day_holds_when_twenty_requests_arrive_at_once(stack: Stack) -> None:
    """The issue's numbers: 20 streams of ``max_tokens`` 50 at once, a day of 300. They
    all run at once (the held engine keeps each after its first token until the gate
    opens), so every admission is decided before any request has ended."""
    url, daemon = stack.url, stack.daemon
    assert daemon.ktctl("load", "held").returncode == 0
    burst = Burst("daily")

    async def main() -> None:
        limits = httpx.Limits(max_connections=40)
        client = httpx.AsyncClient(base_url=url, timeout=60, limits=limits)
        async with client as c, trio.open_nursery() as nursery:
            await burst.send(nursery, c, 20)
            await trio.to_thread.run_sync(open_gate, daemon)

    trio.run(main)
    burst.check(daemon, 20)


def test_a_second_frontend_reserves_around_the_first_s_requests(
    stack: Stack, tmp_path: Path
) -> None:
    """The day is the key's across frontends: what one frontend's requests hold reaches
    the other through the daemon (``Sync.reserved``, ``SyncReply.held``)."""
    url, daemon = stack.url, stack.daemon
    assert daemon.ktctl("load", "held").returncode == 0
    second = launch_frontend(daemon.config, daemon.env, tmp_path / "second.log")
    burst = Burst("shared")
    try:

        async def main() -> None:
            limits = httpx.Limits(max_connections=40)
            first = httpx.AsyncClient(base_url=url, timeout=60, limits=limits)
            other = httpx.AsyncClient(base_url=second.url, timeout=60, limits=limits)
            async with first as a, other as b, trio.open_nursery() as nursery:
                await burst.send(nursery, a, 10)
                await trio.to_thread.run_sync(
                    lambda: wait_for(
                        lambda: held_elsewhere(second.url, "shared") >= 200,
                        what="the second frontend told what the first one's requests hold",
                    )
                )
                await burst.send(nursery, b, 10)
                await trio.to_thread.run_sync(open_gate, daemon)

        trio.run(main)
    finally:
        second.stop()
    burst.check(daemon, 20)


def test_a_request_waiting_for_a_load_an_evict_ends_gets_retry_after(stack: Stack) -> None:
    """The README: an engine whose load failed answers 503 ``engine_failed`` with
    ``Retry-After``; a load an evict ended had none."""
    url, daemon = stack.url, stack.daemon
    got: list[httpx.Response] = []

    def ask() -> None:
        body = {"model": "slow", "messages": HI, "max_tokens": 2}
        headers = {"authorization": f"Bearer {WATCHER}"}
        got.append(httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60))

    waiting = threading.Thread(target=ask)
    waiting.start()
    try:
        daemon.wait_state("slow", "starting")
        assert daemon.ktctl("evict", "slow").returncode == 0
    finally:
        waiting.join(60)
    [r] = got
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed", r.text
    assert int(r.headers["retry-after"]) >= 1


def test_a_key_scoped_to_m1_sees_only_m1_in_what_the_router_reads(stack: Stack) -> None:
    """``/server_info``, ``/model_info`` and ``/get_load`` (sglang-router's reads of a
    worker) answered with another model's engine to a key scoped to m1."""
    url, daemon = stack.url, stack.daemon
    paths = {m["alias"]: m["path"] for m in stack.models}
    scoped = {"authorization": f"Bearer {SCOPED}"}
    watcher = {"authorization": f"Bearer {WATCHER}"}
    assert daemon.ktctl("load", "held").returncode == 0  # the only ready engine: not m1's
    with httpx.Client(base_url=url, timeout=30) as c:
        body = {"model": "held", "messages": HI, "max_tokens": 5, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=body, headers=watcher) as held:
            lines = held.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # it runs
            for path in ("/server_info", "/model_info", "/get_server_info", "/get_model_info"):
                seen = c.get(path, headers=scoped)
                assert seen.status_code == 200, seen.text
                assert seen.json()["model_path"] == paths["m1"], (path, seen.json())
                other = c.get(path, headers={**watcher, "x-ktd-model": "held"})
                assert other.json()["model_path"] == paths["held"]
                named = c.get(path, headers={**scoped, "x-ktd-model": "held"})
                assert named.status_code == 403, named.text
                assert named.json()["error"]["code"] == "model_not_allowed"
            assert c.get("/get_load", headers=watcher).json()[0]["num_reqs"] == 1
            assert c.get("/get_load", headers=scoped).json()[0]["num_reqs"] == 0
            open_gate(daemon)
            assert sum(1 for _ in lines) > 0
