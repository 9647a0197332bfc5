"""The usage ledger through the real daemon, frontend and sim, with the official clients.

What the ledger counts per key and model equals the usage each engine answer carried
(streamed and not; OpenAI, Anthropic, Ollama), the frontend's ``/metrics`` says the same
by key name, and the ledger outlives a frontend restart and a ``kill -9`` of ktd. A key's
day of tokens is the ledger's: a new frontend refuses a key that spent it elsewhere.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import signal
from collections import Counter
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import ConfigWriter, DaemonProc, sim_model

ALICE = "sk-alice-the-analyst"
BOB = "sk-bob-the-batch-job"
FRUGAL = "sk-frugal-twenty-tokens"
KEYS = [
    {"name": "alice", "key": ALICE},
    {"name": "bob", "key": BOB},
    {"name": "frugal", "key": FRUGAL, "tokens_per_day": 20},
]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def launch(write_config: ConfigWriter, daemon_factory: Any, frontend_factory: Any) -> Any:
    models = [sim_model(m, env={"KTD_SIM_TOKEN_RATE": 200}) for m in ("m1", "m2")]
    cfg = write_config(models, frontend={"keys": KEYS})
    daemon: DaemonProc = daemon_factory(cfg)
    return daemon, lambda: frontend_factory(cfg)


def ledger(daemon: DaemonProc, *args: str) -> list[dict[str, Any]]:
    res = daemon.ktctl("usage", "--json", *args)
    assert res.returncode == 0, res.stderr
    rows: list[dict[str, Any]] = json.loads(res.stdout)["usage"]
    return rows


def by_key_model(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Counter[str]]:
    out: dict[tuple[str, str], Counter[str]] = {}
    for r in rows:
        c = out.setdefault((r["key"], r["model"]), Counter())
        for field in ("requests", "prompt", "completion", "errors"):
            c[field] += r[field]
    return out


def test_the_ledger_counts_what_the_engines_reported_and_outlives_both_processes(
    launch: Any,
) -> None:
    daemon, start_frontend = launch
    fe = start_frontend()
    url = str(fe.url)
    want: dict[tuple[str, str], Counter[str]] = {}

    def saw(key: str, model: str, prompt: int, completion: int, errors: int = 0) -> None:
        c = want.setdefault((key, model), Counter())
        c.update(requests=1, prompt=prompt, completion=completion, errors=errors)

    # OpenAI, alice: a body's usage; a stream whose usage chunk the client asked for; a
    # stream whose usage ktd asked for (same prompt, so the same prompt tokens).
    alice = openai.OpenAI(base_url=url + "/v1", api_key=ALICE, max_retries=0, timeout=60)
    body = alice.chat.completions.create(model="m1", messages=HI, max_tokens=6)
    assert body.usage is not None
    saw("alice", "m1", body.usage.prompt_tokens, body.usage.completion_tokens)
    asked = list(
        alice.chat.completions.create(
            model="m1",
            messages=HI,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = asked[-1].usage
    assert usage is not None
    saw("alice", "m1", usage.prompt_tokens, usage.completion_tokens)
    quiet = list(alice.chat.completions.create(model="m1", messages=HI, max_tokens=3, stream=True))
    assert all(c.usage is None for c in quiet)
    saw("alice", "m1", body.usage.prompt_tokens, 3)
    # An error the engine answered (a prompt past the context): counted, no tokens.
    with pytest.raises(openai.BadRequestError):
        alice.completions.create(model="m1", prompt="x " * 40_000, max_tokens=2)
    saw("alice", "m1", 0, 0, errors=1)

    # Anthropic, bob, on m2: the message's usage, and a stream's message_start/delta.
    claude = anthropic.Anthropic(base_url=url, api_key=BOB, max_retries=0, timeout=60)
    msg = claude.messages.create(model="m2", max_tokens=5, messages=HI)  # type: ignore[arg-type]
    saw("bob", "m2", msg.usage.input_tokens, msg.usage.output_tokens)
    with claude.messages.stream(model="m2", max_tokens=4, messages=HI) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    saw("bob", "m2", final.usage.input_tokens, final.usage.output_tokens)

    # Ollama, alice, on m2: prompt_eval_count and eval_count, whole and streamed.
    llama = ollama.Client(host=url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60)
    chat = llama.chat(model="m2", messages=HI, options={"num_predict": 4})
    saw("alice", "m2", chat.prompt_eval_count or 0, chat.eval_count or 0)
    lines = list(llama.chat(model="m2", messages=HI, options={"num_predict": 3}, stream=True))
    # SGLang's streamed /api/chat ends without counts: one token per line (issue 43).
    last = lines[-1]
    saw("alice", "m2", last.prompt_eval_count or 0, last.eval_count or len(lines))

    # The frontend's metrics, by key name (never the secret).
    with httpx.Client(timeout=30) as c:
        text = c.get(url + "/metrics", headers={"authorization": f"Bearer {ALICE}"}).text
    for (key, model), n in want.items():
        line = f'ktd_key_tokens_total{{key="{key}",kind="completion",model="{model}"}}'
        assert f"{line} {float(n['completion'])}" in text, line
        requests = f'ktd_key_requests_total{{key="{key}",model="{model}"}}'
        assert f"{requests} {float(n['requests'])}" in text, requests
    assert 'ktd_key_errors_total{key="alice",model="m1"} 1.0' in text
    assert ALICE not in text and BOB not in text

    # Stopping the frontend hands the ledger the rest; it holds what the engines said.
    fe.stop()
    assert by_key_model(ledger(daemon)) == want
    # kill -9 of ktd, and a new one: the ledger is what it was.
    daemon.stop(signal.SIGKILL)
    daemon.start()
    rows = ledger(daemon)
    assert by_key_model(rows) == want
    today = rows[0]["day"]
    assert {r["day"] for r in rows} == {today}
    assert {r["key"] for r in ledger(daemon, "--key", "bob")} == {"bob"}
    assert ledger(daemon, "--since", "0d") == rows
    tomorrow = dt.date.fromisoformat(today) + dt.timedelta(days=1)
    assert ledger(daemon, "--since", tomorrow.isoformat()) == []
    res = daemon.ktctl("usage", "--csv")
    assert res.returncode == 0, res.stderr
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [(r["key"], r["model"], int(r["requests"])) for r in table] == [
        (r["key"], r["model"], r["requests"]) for r in rows
    ]
    human = daemon.ktctl("usage")
    assert human.returncode == 0 and human.stdout.splitlines()[0].split()[:3] == [
        "DAY",
        "KEY",
        "MODEL",
    ]
    print("\n" + human.stdout)
    assert daemon.ktctl("usage", "--csv", "--json").returncode == 2
    assert daemon.ktctl("usage", "--since", "last week").returncode == 2


def test_a_key_s_day_of_tokens_is_the_ledger_s_across_frontends(launch: Any) -> None:
    daemon, start_frontend = launch
    first = start_frontend()
    client = openai.OpenAI(base_url=f"{first.url}/v1", api_key=FRUGAL, max_retries=0, timeout=60)
    assert client.chat.completions.create(model="m1", messages=HI, max_tokens=30).choices
    first.stop()
    spent = by_key_model(ledger(daemon))[("frugal", "m1")]
    assert spent["prompt"] + spent["completion"] >= 30
    # A frontend started afterwards knows the key's day from the ledger.
    second = start_frontend()
    again = openai.OpenAI(base_url=f"{second.url}/v1", api_key=FRUGAL, max_retries=0, timeout=60)
    with pytest.raises(openai.RateLimitError) as refused:
        again.chat.completions.create(model="m1", messages=HI, max_tokens=2)
    assert "tokens_per_day" in str(refused.value)
