"""``frontend`` mode: the router sends to each host's ktd frontend, which loads on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.conftest import wait_for
from tests.gateway.conftest import Host, Load, RouterProc, model

ALIAS = "m"


def listed(router: RouterProc, url: str) -> dict[str, Any] | None:
    return next((w for w in router.workers() if w["url"].rstrip("/") == url), None)


def frontend_host(name: str, router: RouterProc, hosts: Any, tmp_path: Path) -> Host:
    m = model(ALIAS, tmp_path / f"model-{name}", KTD_SIM_TOKEN_RATE=200)
    gw = {"routers": [router.url], "mode": "frontend", "reconcile_interval": 0.5}
    return hosts(name, [m], gateway=gw, with_frontend=True)  # type: ignore[no-any-return]


def test_frontend_mode_routes_and_loads_on_demand(
    router: RouterProc, hosts: Any, tmp_path: Path
) -> None:
    a = frontend_host("a", router, hosts, tmp_path)
    b = frontend_host("b", router, hosts, tmp_path)
    assert a.frontend is not None and b.frontend is not None
    for h in (a, b):
        assert h.frontend is not None
        wait_for(lambda h=h: listed(router, h.frontend.url), 30, f"{h.name} frontend registered")
    w = listed(router, a.frontend.url)
    assert w is not None and w["model_id"] == ALIAS
    assert w["metadata"]["model_path"] == str(tmp_path / "model-a")  # from our /server_info
    # Nothing is loaded: the first requests through the router load both engines.
    assert a.engine(ALIAS)["state"] == "stopped"
    with Load(router.url, ALIAS, concurrency=4) as load:
        wait_for(
            lambda: a.engine(ALIAS)["state"] == "ready" and b.engine(ALIAS)["state"] == "ready",
            60,
            "both loaded on demand",
        )
        load.wait_ok(20)
        # Evicting one host's engine: its frontend queues what arrives and reloads.
        assert a.daemon.ktctl("evict", ALIAS).returncode == 0
        load.wait_ok(20)
    assert load.failed == [], load.failed[:5]
    info = httpx.get(a.frontend.url + "/get_load", timeout=5).json()
    assert isinstance(info, list) and {"dp_rank", "num_reqs", "num_tokens"} <= set(info[0])
    st = a.status()["gateway"]
    assert st["mode"] == "frontend" and st["frontend_url"] == a.frontend.url
    assert st["routers"][0]["ours"] == 1
    # The frontend's gauges are a periodic copy of the daemon's status: wait for the copy
    # that has the registration (one taken before it says router up and 0 sent).
    up = f'ktd_gateway_router_up{{router="{router.url}"}} 1.0'
    sent = f'ktd_gateway_registrations_total{{router="{router.url}"}} 1.0'
    wait_for(
        lambda: {up, sent} <= set(httpx.get(a.frontend.url + "/metrics").text.splitlines()),
        30,
        "gateway metrics",
    )


def test_frontend_deregistered_when_ktd_stops(
    router: RouterProc, hosts: Any, tmp_path: Path
) -> None:
    a = frontend_host("a", router, hosts, tmp_path)
    assert a.frontend is not None
    wait_for(lambda: listed(router, a.frontend.url), 30, "registered")
    assert a.daemon.stop() == 0
    assert listed(router, a.frontend.url) is None
