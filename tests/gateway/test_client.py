"""The router client (``ktd.gateway.client``): workers parsed, the key sent, failures mapped."""

from __future__ import annotations

import json

import httpx
import pytest

from ktd.gateway.client import RouterClient, RouterError, parse_workers
from ktd.gateway.plan import OWNER_LABEL, Worker


def test_parse_workers_reads_labels_from_metadata() -> None:
    doc = {
        "workers": [
            {"id": "u1", "url": "http://h:1", "model_id": "m", "is_healthy": False,
             "metadata": {OWNER_LABEL: "me", "model_path": "/x"}},
        ],
        "total": 1,
    }  # fmt: skip
    (w,) = parse_workers(doc)
    assert (w.id, w.url, w.model_id, w.healthy, w.owner()) == ("u1", "http://h:1", "m", False, "me")


async def test_client_sends_key_and_body_and_maps_failures() -> None:
    seen: list[httpx.Request] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.method == "POST":
            return httpx.Response(202, json={"worker_id": "abc"})
        if req.method == "DELETE":
            return httpx.Response(404)
        return httpx.Response(503, text="busy")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        c = RouterClient("http://r:1/", http, api_key="k")
        wid = await c.add(
            Worker(url="http://h:2", model_id="m", labels=(("a", "b"),)),
            worker_api_key="wk",
            health_check_interval=7,
        )
        assert wid == "abc"
        await c.remove("gone")  # 404: already gone, fine
        with pytest.raises(RouterError, match="HTTP 503"):
            await c.list_workers()
    body = json.loads(seen[0].content)
    assert seen[0].headers["authorization"] == "Bearer k"
    assert body == {
        "url": "http://h:2",
        "model_id": "m",
        "labels": {"a": "b"},
        "health_check_interval_secs": 7,
        "api_key": "wk",
    }


async def test_client_connection_refused_is_a_router_error() -> None:
    def handle(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        with pytest.raises(RouterError, match="ConnectError"):
            await RouterClient("http://r:1", http).list_workers()
