"""The dashboard's usage panel in a real browser: the ledger's days drawn per key, its
table per key and model; an admin key sees every key's, another key only its own."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from tests.conftest import wait_for
from tests.frontend.ui.conftest import Box, Browser

OPS, ALICE, BOB = "sk-ui-ops", "sk-ui-alice", "sk-ui-bob"
KEYS = [
    {"name": "ops", "key": OPS, "admin": True},
    {"name": "alice", "key": ALICE, "models": ["alpha"]},
    {"name": "bob", "key": BOB},
]


def chat(box: Box, key: str, tokens: int) -> int:
    body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
    r = httpx.post(
        box.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return int(usage["prompt_tokens"] + usage["completion_tokens"])


def test_usage_per_key_and_day_and_each_key_sees_its_own(
    box_factory: Callable[..., Box], browser: Browser
) -> None:
    box = box_factory(frontend={"keys": KEYS})
    spent = {"alice": chat(box, ALICE, 4) + chat(box, ALICE, 2), "bob": chat(box, BOB, 5)}

    def ledger() -> dict[str, int]:
        rows = json.loads(box.ktctl("usage", "--json").stdout)["usage"]
        return {r["key"]: r["prompt"] + r["completion"] for r in rows}

    wait_for(lambda: ledger() == spent, timeout=30, what="the frontend's report")
    b = browser
    b.open(box.url + "/ui?token=" + OPS)
    bars = "#usage svg[data-metric=usage_tokens] rect"
    b.wait("the usage bars", lambda: b.count(bars) == 2)
    drawn = dict(zip(b.attrs(bars, "data-key"), b.attrs(bars, "data-value"), strict=True))
    assert {k: int(v or 0) for k, v in drawn.items()} == spent
    most_first = sorted(spent, key=lambda k: -spent[k])  # ties: in the ledger's order
    assert b.attrs("#usage table.usage tbody tr", "data-key") == most_first
    assert b.count("#usage svg[data-metric=usage_requests] rect") == 2
    assert OPS not in b.text("#usage") and ALICE not in b.text("#usage")

    # Another key sees its own use only.
    b.forget_cookies()
    b.open(box.url + "/ui?token=" + ALICE)
    b.wait("alice's bars", lambda: b.attrs(bars, "data-key") == ["alice"])
    assert b.attrs("#usage table.usage tbody tr", "data-key") == ["alice"]
    assert b.errors() == []
