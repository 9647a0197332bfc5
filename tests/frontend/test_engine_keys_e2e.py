"""Engines only ktd can reach (issue 32), with the real ``ktd serve``, ``ktd frontend`` and sim.

Every engine runs with a key of its own, given in a 0600 YAML file read with
``--config``: its port answers 401 to anyone without it (another local user, or a
process of ours that skipped the frontend), while the frontend's proxied requests,
ktd's health probes and its memory calls (a sleep and a wake) carry it. The key is
in no command line, not in ``ktctl status`` or ``ktctl logs`` or the log file (SGLang
logs its server args, the key among them: masked), not in the frontend's
``/server_info``; a restarted ktd re-adopts the engine and reads its key back from
the file; the file goes with the engine.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import openai

from ktd.daemon.engine.key import key_of_argv
from tests.conftest import ConfigWriter, marked_processes, sim_model, wait_for

ALIAS = "key-kt"


def engine_of(daemon: Any) -> dict[str, Any]:
    return daemon.engines()[ALIAS]  # type: ignore[no-any-return]


def chat(fe_url: str) -> str:
    client = openai.OpenAI(base_url=fe_url + "/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    return reply.choices[0].message.content or ""


def test_an_engine_answers_only_with_its_key_and_ktd_carries_it_everywhere(
    write_config: ConfigWriter,
    daemon_factory: Any,
    frontend_factory: Any,
    ktd_env: dict[str, str],
) -> None:
    cfg = write_config([sim_model(ALIAS, numa=[0], sleep=True)])
    d = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    assert chat(fe.url)  # loads it: the readiness probes carried the key

    e = engine_of(d)
    key, key_file = key_of_argv(e["argv"])
    assert key is not None and key_file is not None and len(key) == 64
    assert key_file == Path(ktd_env["KTD_STATE_DIR"]) / "keys" / f"{ALIAS}.yml"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o777 == 0o700
    engines = [cmd for _pid, cmd in marked_processes() if "--config" in cmd]
    assert engines and not any(key in " ".join(cmd) for cmd in engines)
    assert key not in Path(f"/proc/{e['pid']}/cmdline").read_text()
    dry = json.loads(d.ktctl("load", "--dry-run", "--json", ALIAS).stdout)["plan"]
    assert dry["argv"][-2:] == ["--config", str(key_file)]  # as the launch was

    # The engine's port: 401 without the key or with another; health stays open.
    url = e["url"]
    with httpx.Client(timeout=10) as c:
        for headers in ({}, {"authorization": "Bearer " + "0" * 64}, {"x-api-key": key}):
            denied = c.get(url + "/v1/models", headers=headers)
            assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"})
        body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}
        assert c.post(url + "/v1/chat/completions", json=body).status_code == 401
        assert c.post(url + "/release_memory_occupation", json={"tags": []}).status_code == 401
        assert c.get(url + "/health").status_code == 200
        # A local tool's lease brings the key (the control socket is ktd's user's alone).
        with d.client() as ctl:
            lease = ctl.acquire(ALIAS, "tool")
            assert lease.api_key == key and lease.url == url
            assert c.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}).is_success
            ctl.release(lease.lease)
        # The frontend: proxied, and its /server_info without the engine's key.
        info = c.get(fe.url + "/server_info").json()
        assert info["api_key"] is None and key not in json.dumps(info)

    # Nowhere ktd shows the engine: status, logs (masked in the tail and the file).
    assert key not in d.ktctl("status", "--json").stdout
    logs = d.ktctl("logs", ALIAS, "-n", "2000").stdout
    assert "server_args=ServerArgs(" in logs and f"api_key='{'*' * 64}'" in logs
    log_file = Path(ktd_env["KTD_STATE_DIR"]) / "logs" / f"{ALIAS}.log"
    assert key not in log_file.read_text() and "*" * 64 in log_file.read_text()

    # Sleep and wake: the release, the load count and the resume carry the key.
    assert d.ktctl("sleep", ALIAS).returncode == 0
    assert engine_of(d)["state"] == "asleep"
    assert chat(fe.url)  # the request wakes it
    assert engine_of(d)["state"] == "ready" and engine_of(d)["pid"] == e["pid"]

    # A kill -9 of ktd: the new daemon adopts the engine and reads its key from the file.
    d.stop(signal.SIGKILL)
    d.start()
    wait_for(lambda: engine_of(d)["state"] == "ready", timeout=30, what="re-adopted")
    assert engine_of(d)["pid"] == e["pid"] and key_file.exists()
    assert chat(fe.url)
    assert key not in "\n".join(d.ktctl("logs", ALIAS, "-n", "2000").stdout)

    # Evicted: its key file is gone with it, and the directory is empty.
    assert d.ktctl("evict", ALIAS).returncode == 0
    assert not key_file.exists() and os.listdir(key_file.parent) == []
