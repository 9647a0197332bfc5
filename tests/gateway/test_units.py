"""Config validation, the router client's parsing, worker-info shapes, ktctl rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktctl import render
from ktd import protocol as p
from ktd.core.config import ConfigError, load_config
from ktd.frontend.worker_info import model_info_shape, server_info_shape, sum_loads
from ktd.gateway import doctor
from ktd.gateway.client import RouterClient, RouterError, parse_workers
from ktd.gateway.plan import OWNER_LABEL, Worker


def write(tmp_path: Path, gateway: Any, **more: Any) -> Path:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"gateway": gateway, **more}))
    return cfg


def test_gateway_section_defaults_off(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {}))
    assert cfg.gateway.routers == [] and cfg.gateway.mode == "engines"


@pytest.mark.parametrize(
    ("gateway", "more", "path"),
    [
        ({"routers": ["http://r:1"], "bogus": 1}, {}, "$.gateway"),
        ({"routers": ["r:1"]}, {}, "$.gateway.routers[0]"),
        ({"routers": ["http://r:1", "http://r:1/"]}, {}, "$.gateway.routers"),
        ({"mode": "pods"}, {}, "$.gateway.mode"),
        ({"reconcile_interval": 0}, {}, "$.gateway.reconcile_interval"),
        ({"labels": {"bad key": "x"}}, {}, "$.gateway.labels.bad key"),
        ({"labels": {"k": 1}}, {}, "$.gateway.labels"),
        ({"advertise": "a b"}, {}, "$.gateway.advertise"),
        ({"model_id": "a:b"}, {}, "$.gateway.model_id"),
        (
            {"routers": ["http://r:1"], "mode": "frontend"},
            {"frontend": {"bind": "unix:/tmp/x"}},
            "$.gateway.mode",
        ),
    ],
)
def test_gateway_errors_name_file_and_field(
    tmp_path: Path, gateway: Any, more: Any, path: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, gateway, **more))
    assert err.value.file.endswith("config.json")
    assert err.value.path.startswith(path), err.value


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


def test_worker_info_shapes_are_sglangs() -> None:
    mi = model_info_shape("/models/x")
    assert set(mi) >= {
        "model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
        "weight_version", "has_image_understanding", "has_audio_understanding",
        "model_type", "architectures",
    }  # fmt: skip
    si = server_info_shape("x", "/models/x", status="stopped")
    assert si["served_model_name"] == "x" and si["model_path"] == "/models/x"
    assert "version" in si and si["internal_states"][0]["status"] == "stopped"
    assert sum_loads([]) == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    got = sum_loads(  # /v1/loads entries of two engines
        [
            [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 1, "num_used_tokens": 10}],
            [
                {"dp_rank": 0, "num_running_reqs": 1, "num_used_tokens": 5, "memory": {}},
                {"dp_rank": 1, "num_running_reqs": 4},
            ],
        ]
    )
    assert got == [
        {"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 15},
        {"dp_rank": 1, "num_reqs": 4, "num_waiting_reqs": 0, "num_tokens": 0},
    ]


def test_status_table_gains_a_gateway_column_only_when_registering() -> None:
    plain = p.EngineInfo(alias="m", state="ready")
    assert "GATEWAY" not in render.status_table([plain], 0)
    reg = p.EngineInfo(
        alias="m",
        state="ready",
        gateway=[p.Registration(router="http://r:1", state="registered")],
    )
    text = render.status_table([reg], 0)
    assert "GATEWAY" in text and "registered" in text
    assert render.gateway_cell([]) == "-"
    two = [
        p.Registration(router="a", state="registered"),
        p.Registration(router="b", state="absent"),
    ]
    assert render.gateway_cell(two) == "registered,absent"


def test_gateway_text() -> None:
    info = p.GatewayInfo(
        mode="engines",
        routers=[
            p.RouterInfo(url="http://r:1", up=True, workers=3, ours=1),
            p.RouterInfo(url="http://r:2", up=False, failures=2, error="refused", next_try=15.0),
        ],
    )
    text = render.gateway_text(info, now=10.0)
    assert "http://r:1: up, 1 of 3 worker(s) ours" in text
    assert "http://r:2: DOWN (2 failure(s), retry in 5.0s): refused" in text


def test_doctor_checks() -> None:
    from ktd.core.config import GatewaySection
    from ktd.gateway.plan import Listed

    cfg = GatewaySection(routers=["http://10.0.0.1:30000"])
    ours = Listed(id="1", url="http://127.0.0.1:5", labels={OWNER_LABEL: "me"})
    got = doctor.checks(
        cfg,
        [doctor.RouterProbe("http://10.0.0.1:30000", [ours]), doctor.RouterProbe("x", error="no")],
        instance="me",
        wanted=["http://127.0.0.1:5", "http://127.0.0.1:6"],
        advertised_hosts=["127.0.0.1"],
    )
    assert [(c.name, c.status) for c in got] == [
        ("gateway.http://10.0.0.1:30000", "warn"),
        ("gateway.x", "fail"),
        ("gateway.advertise", "warn"),
    ]
    assert "http://127.0.0.1:6" in got[0].detail
    assert doctor.checks(GatewaySection(), [], instance=None) == []
