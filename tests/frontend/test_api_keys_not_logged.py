"""API keys are never written to any log, right or wrong."""

from __future__ import annotations

from typing import Any

import httpx

from tests.frontend.frontend_helpers import sim_entry


def test_keys_never_logged(write_config: Any, daemon_factory: Any, frontend_factory: Any) -> None:
    secret, wrong = "sk-secret-7d1f", "sk-wrong-93ab"
    cfg = write_config([sim_entry("k-kt")], frontend={"api_keys": [secret]})
    daemon = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    body = {"model": "k-kt", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(
        fe.url + "/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {wrong}"},
    )
    assert r.status_code == 401 and wrong not in r.text
    r = httpx.post(
        fe.url + "/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        fe.url + "/v1/chat/completions",
        json={"model": "nope"},
        timeout=60,
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert r.status_code == 404 and secret not in r.text
    logs = fe.output() + daemon.output() + "\n".join(daemon.client().logs("k-kt", 10_000))
    assert secret not in logs and wrong not in logs
    daemon.ktctl("evict", "--all")
