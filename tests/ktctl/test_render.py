"""ktctl's text (``ktctl.render``): the gateway's column and lines."""

from __future__ import annotations

from ktctl import render
from ktd import protocol as p


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


def test_status_table_gains_a_queued_column_while_requests_wait() -> None:
    idle = p.EngineInfo(alias="m", state="ready")
    assert "QUEUED" not in render.status_table([idle], 100.0)
    busy = p.EngineInfo(alias="m", state="ready", queued=3, queued_since=88.0)
    text = render.status_table([busy, idle], 100.0)
    assert "QUEUED" in text and "3, 12.0s" in text
    assert render.queued_cell(idle, 100.0) == "-"
    assert render.queued_cell(p.EngineInfo(alias="m", state="ready", queued=2), 0) == "2"
