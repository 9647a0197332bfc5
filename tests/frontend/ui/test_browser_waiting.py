"""The dashboard's waiting panel in a real browser (issue 46): the requests waiting for
their engine, per model and key, with their phase, place in the line and ETA; an admin
key sees every key's, another key only its own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import wait_for
from tests.frontend.ui.conftest import Browser
from tests.frontend.ui.uienv import box_models

OPS, ALICE, BOB = "sk-wait-ops", "sk-wait-alice", "sk-wait-bob"
KEYS = [
    {"name": "ops", "key": OPS, "admin": True},
    {"name": "alice", "key": ALICE},
    {"name": "bob", "key": BOB},
]
CHAT: Any = [{"role": "user", "content": "hi"}]


def test_waiting_requests_per_model_and_key_with_phase_and_place(
    tmp_path: Path,
    box_env: dict[str, str],
    write_config: Any,
    daemon_factory: Any,
    frontend_factory: Any,
    browser: Browser,
) -> None:
    # alpha serves one request at a time, each held until the test opens the sim's gate.
    models = box_models(tmp_path / "models", max_concurrent=1)
    models[0]["kt"]["extra_env"]["KTD_SIM_HOLD"] = "1"
    cfg = write_config(models, frontend={"keys": KEYS})
    daemon = daemon_factory(cfg, env=box_env)
    fe = frontend_factory(cfg, env=box_env)
    done: list[int] = []

    def chat(key: str, rid: str) -> None:
        body = {"model": "alpha", "messages": CHAT, "max_tokens": 2}
        headers = {"Authorization": f"Bearer {key}", "X-Request-Id": rid}
        r = httpx.post(fe.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        done.append(r.status_code)

    def in_line() -> list[Any]:
        r = httpx.get(fe.url + "/v1/ktd/requests", headers={"Authorization": f"Bearer {OPS}"})
        return [w for w in r.json()["data"] if w["position"]]

    first = threading.Thread(target=chat, args=(ALICE, "a-0"), daemon=True)
    first.start()  # it waits for alpha's load, then holds its one slot (listed: prefill)
    wait_for(lambda: daemon.engines()["alpha"]["in_flight"] == 1, timeout=30, what="a-0 runs")
    line = [
        threading.Thread(target=chat, args=(k, r), daemon=True)
        for k, r in ((ALICE, "a-1"), (BOB, "b-1"), (ALICE, "a-2"))
    ]
    for i, t in enumerate(line):
        t.start()
        wait_for(lambda n=i + 1: len(in_line()) == n, what=f"{i + 1} in line")

    b = browser
    rows = "#waiting table.waiting tbody tr"
    b.open(fe.url + "/ui?token=" + OPS)
    b.wait("four rows", lambda: b.count(rows) == 4)
    assert b.attrs(rows, "data-key") == ["alice", "bob", "alice", "alice"]
    assert b.attrs(rows, "data-position") == ["1", "2", "3", "0"]
    # The frontend looks at its engines every 0.5 s while anything waits: a look taken
    # during alpha's load says "loading" until the next one (the page polls on).
    phases = ["queued", "queued", "queued", "prefill"]
    b.wait("the line's phases", lambda: b.attrs(rows, "data-phase") == phases)
    assert "1 of 3" in b.text("#waiting") and "alpha · alice: 3" in b.text("#waiting")
    assert OPS not in b.text("#waiting") and ALICE not in b.text("#waiting")

    b.forget_cookies()
    b.open(fe.url + "/ui?token=" + BOB)
    b.wait("bob's own row", lambda: b.attrs(rows, "data-key") == ["bob"])
    assert b.attrs(rows, "data-position") == ["2"]

    port = daemon.engines()["alpha"]["port"]
    httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}, timeout=30)
    for t in (first, *line):
        t.join(30)
    assert done == [200] * 4
    b.wait("nothing waiting", lambda: "No request is waiting." in b.text("#waiting"))
    assert b.errors() == []
