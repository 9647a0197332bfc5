"""Sleep on the dashboard: asleep, sleeping and waking cards, the host memory sleepers keep
on their NUMA nodes, and the Sleep / Wake buttons (behind ``ui_control``, like Load/Evict).

The daemon is a fake (frontend_fakes.StatusDaemon) that reports engines in every sleep
state and moves them when a button asks; the frontend runs in process and the page in
Debian's chromium, driven from a thread while trio serves both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from ktd import protocol as p
from tests.frontend.frontend_fakes import StatusDaemon
from tests.frontend.frontend_helpers import StartFrontend
from tests.frontend.ui.conftest import Browser

KEY = "sk-ui-sleep"
GIB = 1 << 30
ACT = {"X-Ktd-UI": "1"}


def _box(d: StatusDaemon) -> None:
    now = time.time()
    d.machine = p.MachineReply(
        cpu_model="Fake Xeon",
        nodes=[
            p.NodeInfo(
                id=n, cpus=[n], mem_total=256 * GIB, mem_free=150 * GIB, mem_available=150 * GIB
            )
            for n in (0, 1)
        ],
        gpus=[p.GpuInfo(index=g, name="NVIDIA L40S", memory_total=45 * GIB) for g in (0, 1)],
        holders=[p.Holder(alias="alpha", state="ready", numa_nodes=[0], cpus=[0], gpus=[0])],
    )
    d.put(
        p.EngineInfo(
            alias="alpha",
            state="ready",
            sleep="on",
            numa_nodes=[0],
            cpus=[0],
            gpus=[0],
            started_at=now - 300,
            url="http://127.0.0.1:9",
        )
    )
    d.put(
        p.EngineInfo(
            alias="beta",
            state="asleep",
            sleep="on",
            numa_nodes=[0, 1],
            gpus=[1],
            started_at=now - 1000,
            asleep_since=now - 90,
            sleep_ttl=3600.0,
            host_bytes=64 * GIB,
            reason="put to sleep",
        )
    )
    d.put(p.EngineInfo(alias="gamma", state="stopped", sleep="unsupported"))
    d.put(p.EngineInfo(alias="delta", state="stopped"))  # sleep "off": no sleep buttons


@pytest.fixture
async def daemon(runtime_dir: Path, nursery: trio.Nursery) -> StatusDaemon:
    d = StatusDaemon(f"ipc://{runtime_dir}/control.sock")
    _box(d)
    await nursery.start(d.run)
    return d


def _sent(d: StatusDaemon, kind: type[p.Request]) -> list[Any]:
    return [getattr(r, "alias", None) for r in d.requests if type(r) is kind]


async def test_sleep_and_wake_actions_send_the_daemon_sleep_and_wake(
    daemon: StatusDaemon, start_frontend: StartFrontend
) -> None:
    fe = await start_frontend(api_keys=[KEY], ui_control=True)
    bearer = {"Authorization": f"Bearer {KEY}", **ACT}
    async with fe.client(headers=bearer) as c:
        view = (await c.get("/ui/api/view")).json()["view"]
        cards = {m["alias"]: m for m in view["models"]}
        beta = cards["beta"]
        assert beta["state"] == "asleep" and beta["sleep_expires"] == beta["asleep_since"] + 3600
        assert beta["host_bytes"] == 64 * GIB and cards["gamma"]["sleep"] == "unsupported"
        node0, node1 = view["machine"]["nodes"]
        assert node0["holders"] == ["alpha"]
        assert node0["asleep"] == node1["asleep"] == [{"alias": "beta", "bytes": 32 * GIB}]

        r = await c.post("/ui/api/action", json={"action": "sleep", "alias": "alpha"})
        assert r.status_code == 200 and r.json() == {"ok": True, "message": "alpha: asleep"}
        r = await c.post("/ui/api/action", json={"action": "wake", "alias": "beta"})
        assert r.status_code == 200 and r.json()["message"] == "beta: ready"
        assert _sent(daemon, p.Sleep) == ["alpha"] and _sent(daemon, p.Wake) == ["beta"]
        # What the daemon will not do is a 409 with its words, not a daemon fault (503).
        daemon.refuse["gamma"] = (p.ErrorCode.NO_SLEEP, "gamma cannot sleep: no memory saver")
        r = await c.post("/ui/api/action", json={"action": "sleep", "alias": "gamma"})
        assert r.status_code == 409 and "no memory saver" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "no_sleep"
        bad = await c.post("/ui/api/action", json={"action": "nap", "alias": "alpha"})
        assert bad.status_code == 400 and "sleep, wake" in bad.json()["error"]["message"]
    async with fe.client(headers={"Authorization": f"Bearer {KEY}"}) as c:  # no page header
        r = await c.post("/ui/api/action", json={"action": "wake", "alias": "alpha"})
        assert r.status_code == 403
    assert _sent(daemon, p.Wake) == ["beta"]


async def test_sleep_buttons_are_off_without_ui_control(
    daemon: StatusDaemon, start_frontend: StartFrontend
) -> None:
    fe = await start_frontend()
    async with fe.client(headers=ACT) as c:
        r = await c.post("/ui/api/action", json={"action": "sleep", "alias": "alpha"})
        assert r.status_code == 403 and "ui_control" in r.json()["error"]["message"]
    assert _sent(daemon, p.Sleep) == []


def _in_thread(fn: Callable[[], None]) -> Any:
    return trio.to_thread.run_sync(fn)


async def test_asleep_cards_the_machine_and_the_buttons_in_a_browser(
    daemon: StatusDaemon, start_frontend: StartFrontend, browser: Browser
) -> None:
    fe = await start_frontend(api_keys=[KEY], ui_control=True)
    b = browser

    def card(alias: str, part: str = "") -> str:
        return f".card[data-alias={alias}] {part}".strip()

    def enabled(selector: str) -> list[bool]:
        return [v is None for v in b.attrs(selector, "disabled")]

    def see() -> None:
        b.open(fe.url + "/ui?token=" + KEY)
        b.wait("the cards", lambda: b.count(".card") == 4)
        assert b.card_state("beta") == "asleep" and b.text(card("beta", ".state")) == "asleep"
        line = b.text(card("beta", ".sleepline"))
        assert "asleep since" in line and "ago" in line and "holds 64.0 GiB" in line, line
        b.wait(
            "the sleep TTL ticking", lambda: "stopped in 58m" in b.text(card("beta", ".sleepline"))
        )
        assert "sleep TTL" in b.text(card("beta", ".stats"))
        assert "a request wakes it" in b.text(card("beta", ".phase"))
        assert "put to sleep" in b.text(card("beta", ".reason.muted"))
        assert b.text(card("gamma", ".sleep-mode")) == "sleep: unsupported"
        assert not b.count(card("alpha", ".sleep-mode"))
        # The machine: beta's host memory on both its nodes, striped, apart from alpha.
        b.wait("the machine", lambda: b.count("[data-node]") == 2)
        assert b.text("[data-node='0'] .chip") == "alpha"
        assert b.text("[data-node='0'] .chip.asleep") == "beta · asleep"
        assert b.text("[data-node='1'] .chip.asleep") == "beta · asleep"
        bar = "[data-node='1'] .mem .asleep[data-asleep=beta]"
        width = b.js("return document.querySelector(arguments[0]).style.width", bar)
        assert width == "12.5%", width  # 32 GiB of 256
        fill = b.js("return document.querySelector(arguments[0]).style.background", bar)
        assert "repeating-linear-gradient" in fill
        assert "32.0 GiB kept by beta asleep" in b.text("[data-node='1'] .mem-text")
        assert not b.count("[data-gpu='1'] .chip")  # asleep: no GPU
        # Buttons beside Load and Evict, where the model sleeps.
        assert enabled(card("alpha", "button.sleep")) == [True]
        assert enabled(card("alpha", "button.wake")) == [False]
        assert enabled(card("beta", "button.wake")) == [True]
        assert enabled(card("beta", "button.sleep")) == [False]
        assert enabled(card("beta", "button.load")) == [False]  # woken, not loaded
        assert enabled(card("beta", "button.evict")) == [True]  # stops it: host memory back
        assert not b.count(card("gamma", "button.sleep")) and not b.count(
            card("delta", "button.wake")
        )
        assert enabled(card("gamma", "button.load")) == [True]

        b.click(card("alpha", "button.sleep"))
        b.wait("the answer", lambda: b.text("#toast") == "alpha: asleep")
        b.wait("alpha asleep", lambda: b.card_state("alpha") == "asleep")
        b.wait("alpha's memory on node 0", lambda: b.count("[data-node='0'] .chip.asleep") == 2)
        assert "no sleep TTL" in b.text(card("alpha", ".sleepline"))
        b.click(card("beta", "button.wake"))
        b.wait("beta ready", lambda: b.card_state("beta") == "ready")
        b.wait("node 1 free of sleepers", lambda: not b.count("[data-node='1'] .chip.asleep"))
        assert enabled(card("beta", "button.sleep")) == [True]

    await _in_thread(see)
    assert _sent(daemon, p.Sleep) == ["alpha"] and _sent(daemon, p.Wake) == ["beta"]

    # Sleeping and waking: the state shown as it is, between the two.
    for state in ("sleeping", "waking"):
        daemon.put(p.EngineInfo(alias="alpha", state=state, sleep="on", phase=f"{state} (fake)"))

        def shown(state: str = state) -> None:
            b.wait(state, lambda: b.card_state("alpha") == state)
            assert b.text(card("alpha", ".state")) == state
            assert b.text(card("alpha", ".phase")) == f"{state} (fake)"
            assert enabled(card("alpha", "button.wake")) == [state == "sleeping"]

        await _in_thread(shown)
    assert b.errors() == []
