"""An asleep engine seen through the frontend (a fake daemon, the app in process).

Asleep is a model loaded in host RAM with no VRAM and no address: ``/api/ps`` lists
it with ``size_vram`` 0 until its ``sleep_ttl``, ``/metrics`` and ``/v1/models`` say
``asleep``, ``/api/show`` describes it without waking it, and a request for it is one
for a model this frontend holds no claim on: one ``Claim`` to the daemon (which wakes
it), the stream kept company with ``: waking`` comments meanwhile.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from ktd import protocol as p
from tests.frontend.frontend_fakes import FakeEngine, StatusDaemon
from tests.frontend.frontend_helpers import StartFrontend

EST = {"host_bytes": 100, "gpu_bytes": 30, "gpu_weights_bytes": 20, "ctx": 512}


@pytest.fixture
async def daemon(runtime_dir: Path, nursery: trio.Nursery) -> StatusDaemon:
    d = StatusDaemon(f"ipc://{runtime_dir}/control.sock")
    await nursery.start(d.run)
    return d


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_ps_metrics_and_models_list_an_asleep_engine_and_show_does_not_wake_it(
    daemon: StatusDaemon, start_frontend: StartFrontend
) -> None:
    daemon.estimate = EST
    now = time.time()
    daemon.put(p.EngineInfo(alias="r", state="ready", ttl=0.0, sleep="on"))
    daemon.put(
        p.EngineInfo(
            alias="z",
            state="asleep",
            sleep="on",
            asleep_since=now - 100,
            sleep_ttl=600.0,
            host_bytes=120,
            numa_nodes=[0],
        )
    )
    daemon.put(p.EngineInfo(alias="w", state="waking", sleep="on"))
    fe = await start_frontend()
    async with fe.client() as c:
        ps = (await c.get("/api/ps")).json()["models"]
        assert [(m["name"], m["size"], m["size_vram"]) for m in ps] == [
            ("r:latest", 130, 30),  # Forever first
            ("z:latest", 130, 0),
        ]
        left = (_iso(ps[1]["expires_at"]) - datetime.now(UTC)).total_seconds()
        assert 490 < left <= 501  # asleep_since + sleep_ttl
        metrics = (await c.get("/metrics")).text
        assert 'ktd_engine_state{alias="z",state="asleep"} 1.0' in metrics
        assert 'ktd_engine_state{alias="w",state="waking"} 1.0' in metrics
        assert 'ktd_engine_state{alias="r",state="asleep"} 0.0' in metrics
        cards = {m["id"]: m["state"] for m in (await c.get("/v1/models")).json()["data"]}
        assert cards == {"r": "ready", "z": "asleep", "w": "waking"}
        shown = await c.post("/api/show", json={"model": "z"})
        assert shown.status_code == 200 and "num_ctx 512" in shown.json()["modelfile"]
    assert daemon.acquires == 0  # nothing asked for a claim: nothing woke


async def test_a_request_for_an_asleep_model_claims_it_and_waits_with_waking_comments(
    daemon: StatusDaemon, fake_engine: FakeEngine, start_frontend: StartFrontend
) -> None:
    daemon.put(p.EngineInfo(alias="z", state="asleep", sleep="on", asleep_since=time.time()))
    daemon.add("z", url=fake_engine.url, load_delay=1.2)  # the claim: the daemon's wake
    fe = await start_frontend()
    body = json.dumps({"model": "z", "stream": True, "messages": []}).encode()
    async with fe.client() as c, c.stream("POST", "/v1/chat/completions", content=body) as resp:
        assert resp.status_code == 200
        data = b""
        async for chunk in resp.aiter_raw():
            data += chunk
    events = [e for e in data.split(b"\n\n") if e]
    assert any(e.startswith(b": waking z ") for e in events), events
    assert not any(e.startswith(b": loading") for e in events), events
    assert events[-1] == b"data: [DONE]"
    assert daemon.acquires == 1
