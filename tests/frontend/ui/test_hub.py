"""The dashboard's server side over HTTP: a real daemon and sim engines, the frontend in process.

What a browser cannot show quickly or at all: the traffic history filling from real
requests and the engine's own counters, the access rules request by request, the
buttons' answers, heartbeats, a stream ending when the frontend stops, and a page
that falls behind being dropped.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ktd.frontend import ui
from ktd.frontend.origin import Guard
from ktd.frontend.router import Router
from ktd.frontend.routes import Match
from ktd.frontend.ui import hub as hubmod
from ktd.frontend.ui.access import COOKIE, cookie_value
from tests.frontend.frontend_helpers import Frontend, StartFrontend
from tests.frontend.ui.conftest import Box, sse_events
from tests.frontend.ui.uienv import box_models

CHAT = {"model": "alpha", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
KEY = "sk-hub-9"


@pytest.fixture
def daemon(
    tmp_path: Path, box_env: dict[str, str], write_config: Any, daemon_factory: Any
) -> Iterator[Any]:
    models = box_models(tmp_path / "models")
    # A first token 10 ms after the request: the engine's own mean time to first token is
    # then above the 0.1 ms the history rounds to (the sim's own is a few microseconds,
    # a 0.0 that the traffic test waited out for up to 20 s until one slow tick showed).
    models[0]["kt"]["extra_env"]["KTD_SIM_PREFILL_TIME"] = "0.01"
    cfg = write_config(models)
    d = daemon_factory(cfg, env=box_env)
    yield d
    # The in-process frontend is gone without giving its claims back: stop the engines
    # at once rather than have the daemon's own stop wait its drain_timeout for them.
    if d.proc.poll() is None:
        with d.client() as c:
            c.evict(all=True, force=True)


async def ktctl(daemon: Any, *args: str) -> None:
    r = await trio.to_thread.run_sync(lambda: daemon.ktctl(*args))
    assert r.returncode == 0, r.stdout + r.stderr


async def frontend(start: StartFrontend, daemon: Any, **kw: Any) -> Frontend:
    return await start(f"ipc://{daemon.socket}", **kw)


async def test_traffic_history_from_the_frontends_and_the_engines_counters(
    daemon: Any, start_frontend: StartFrontend
) -> None:
    fe = await frontend(start_frontend, daemon, ui_sample_interval=0.2)
    # Proxied requests never reach the dashboard's code (the router hands it its own).
    guard = fe.app.asgi_app  # the Origin and Host checks, in front of everything
    assert isinstance(guard, Guard)
    router = guard.app
    assert isinstance(router, Router)
    seen: list[str] = []
    dashboard = router.owners["ui"]

    async def counting(found: Match, scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get("path", ""))
        await dashboard(found, scope, receive, send)

    router.owners["ui"] = counting
    await ktctl(daemon, "load", "alpha")
    async with fe.client() as c:
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200

        async def traffic() -> list[Any] | None:
            points = (await c.get("/ui/api/series")).json()["series"].get("alpha", [])
            busy = [p for p in points if p[1] > 0 and p[2] and p[3] is not None and p[4]]
            return busy or None

        with trio.fail_after(30):
            while not (busy := await traffic()):
                await c.post("/v1/chat/completions", json=CHAT)
                await trio.sleep(0.1)
    assert seen and not [path for path in seen if path.startswith("/v1/")], seen
    t, rps, tps, ttfb, ttft = busy[-1]
    assert abs(t - time.time()) < 60 and rps > 0 and tps > 0 and ttfb > 0 and ttft > 0
    body = (await fe.client().get("/ui/api/series")).json()
    assert body["interval"] == 0.2 and "beta" in body["series"]  # served, no traffic: zeros


async def test_the_stream_view_machine_heartbeat_and_end_at_shutdown(
    daemon: Any, start_frontend: StartFrontend
) -> None:
    fe = await frontend(start_frontend, daemon, idle_timeout=2.0)  # a ping every second
    async with fe.client() as c, c.stream("GET", "/ui/api/events?logs=alpha") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        events = sse_events(resp)
        seen: dict[str, Any] = {}
        async for name, data in events:
            seen[name] = data
            if name == "logtail":
                break
        assert seen["hello"]["heartbeat"] == 1.0
        assert [m["alias"] for m in seen["view"]["view"]["models"]] == ["alpha", "beta", "qwen3"]
        assert seen["logtail"] == {"alias": "alpha", "lines": []}
        await ktctl(daemon, "load", "alpha")
        machine, pinged, lines = None, False, []
        with trio.fail_after(30):
            async for name, data in events:
                if name == "log":
                    lines += data["lines"]
                elif name == "ping":
                    pinged = abs(data["now"] - time.time()) < 60
                elif name == "view":
                    m = data["view"]["machine"]
                    if m and m["nodes"][0]["holders"] == ["alpha"]:
                        machine = m
                if machine and pinged and any("[ktd] ready on" in ln for ln in lines):
                    break
        assert [n["id"] for n in machine["nodes"]] == [0, 1]
        assert machine["gpus"][0]["holders"] == ["alpha"] and machine["gpus"][1]["holders"] == []
        assert machine["cpu_owner"] == [[0, "alpha"]]
        assert not any("ktd=probe" in ln for ln in lines)
        ui.close(fe.app)  # what SIGTERM does
        with trio.fail_after(10):
            async for _ in events:
                pass  # the stream ends: the frontend's graceful wait is not held
        assert (await c.get("/ui/api/events")).status_code == 503


async def test_access_and_buttons_request_by_request(
    daemon: Any, start_frontend: StartFrontend
) -> None:
    fe = await frontend(start_frontend, daemon, api_keys=[KEY], ui_control=True)
    bearer = {"Authorization": f"Bearer {KEY}"}
    async with fe.client() as c:
        page = await c.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'sha256-" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"
        assert "alpha" not in page.text  # the page carries no data
        assert (await c.get("/ui/favicon.svg")).headers["content-type"] == "image/svg+xml"
        assert (await c.get("/ui/api/session")).json() == {
            "auth": True,
            "ok": False,
            "control": False,
            "heartbeat": 7.5,
        }
        for path in ("/ui/api/view", "/ui/api/series", "/ui/api/plan?alias=alpha"):
            assert (await c.get(path)).status_code == 401, path
        assert (await c.get("/ui/api/view", headers=bearer)).status_code == 200
        assert (await c.post("/ui/api/login", json={"key": "nope"})).status_code == 401
        assert (await c.post("/ui/api/login", content=b"[1")).status_code == 400
        login = await c.post("/ui/api/login", json={"key": KEY})
        assert login.status_code == 200 and login.json()["control"] is True
        set_cookie = login.headers["set-cookie"]
        assert set_cookie.startswith(f"{COOKIE}={cookie_value(KEY)};")
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        assert c.cookies.get(COOKIE) == cookie_value(KEY)
        view = (await c.get("/ui/api/view")).json()
        assert view["view"]["daemon"]["up"] and view["now"] > 0
        plan = (await c.get("/ui/api/plan?alias=alpha")).json()["plan"]
        assert plan["numa_nodes"] == [0] and plan["gpus"] == [0] and plan["fit"]["ok"]
        assert (await c.get("/ui/api/plan?alias=nope")).status_code == 404
        assert (await c.get("/ui/api/plan")).status_code == 400
        assert (await c.get("/ui/nothing")).status_code == 404
        assert (await c.post("/ui/api/view")).status_code == 405

        act = {"X-Ktd-UI": "1"}
        load = {"action": "load", "alias": "alpha"}
        assert (await c.post("/ui/api/action", json=load)).status_code == 403  # no header
        r = await c.post("/ui/api/action", json=load, headers=act)
        assert r.status_code == 200 and r.json()["ok"], r.text
        bad = await c.post("/ui/api/action", json={"action": "rm"}, headers=act)
        assert bad.status_code == 400
        nope = await c.post("/ui/api/action", json={"action": "load", "alias": "x"}, headers=act)
        assert nope.status_code == 404
        r = await c.post("/ui/api/action", json={"action": "reload"}, headers=act)
        assert r.status_code == 200 and r.json()["ok"]
        r = await c.post("/ui/api/action", json={"action": "evict", "alias": "alpha"}, headers=act)
        assert r.status_code in (200, 202) and r.json()["ok"]
        await c.post("/ui/api/logout")
        assert COOKIE not in c.cookies
        assert (await c.get("/ui/api/view")).status_code == 401


async def test_buttons_are_off_by_default(daemon: Any, start_frontend: StartFrontend) -> None:
    fe = await frontend(start_frontend, daemon)
    async with fe.client() as c:
        assert (await c.get("/ui/api/session")).json()["control"] is False
        r = await c.post(
            "/ui/api/action", json={"action": "load", "alias": "alpha"}, headers={"X-Ktd-UI": "1"}
        )
        assert r.status_code == 403 and "ui_control" in r.json()["error"]["message"]


async def test_a_page_that_falls_behind_is_dropped_after_what_it_has() -> None:
    viewer = hubmod.Viewer(logs=None)
    for i in range(hubmod.QUEUE + 5):
        viewer.push(b"%d" % i)
    got = []
    with pytest.raises(trio.EndOfChannel):
        while True:
            got.append(await viewer.recv.receive())
    assert len(got) == hubmod.QUEUE  # what was queued goes out; then the stream ends


async def test_a_page_that_stops_reading_is_let_go_after_the_send_timeout(
    daemon: Any, start_frontend: StartFrontend, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31, item 5: a dropped page whose reader stopped stayed blocked in its write
    for ever (0 of 30 let go after 512 messages). Now its write is bounded by
    ``frontend.send_timeout``: the connection closes, the page leaves the hub, quietly."""
    fe = await frontend(start_frontend, daemon, send_timeout=0.5)
    hub = fe.app.extensions["ktd.ui"]
    host, port = fe.url.removeprefix("http://").rsplit(":", 1)
    deaf = trio.socket.socket()
    deaf.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    with deaf:
        await deaf.connect((host, int(port)))
        await deaf.send(f"GET /ui/api/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        with trio.fail_after(10):
            while not hub.viewers:
                await trio.sleep(0.01)
        big = b"x" * 65536  # views far bigger than any, until the page's writes block
        with trio.fail_after(30):
            while hub.viewers:
                hub._broadcast(big)
                await trio.sleep(0.01)
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert any("stopped reading" in r.getMessage() for r in caplog.records)


def test_sigterm_ends_live_streams_at_once(
    box_factory: Callable[..., Box],
) -> None:
    """With a 30 s graceful timeout, an open dashboard stream must not hold the shutdown."""
    box = box_factory(args=("--graceful-timeout", "30"))
    with httpx.Client(timeout=10) as c, c.stream("GET", box.url + "/ui/api/events") as resp:
        first = next(resp.iter_bytes())
        assert first.startswith(b"retry: 1000")
        box.frontend.proc.send_signal(signal.SIGTERM)
        try:
            box.frontend.proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("an open dashboard stream held the frontend's SIGTERM")
        assert box.frontend.proc.returncode == 0


def test_a_log_follower_drops_by_count_what_its_tail_held() -> None:
    """Batches published while the tail was read arrive before or after it; those with a
    count within the tail's are dropped, repeated text is kept, and the filter ends at
    the first newer batch (a restarted daemon counts from the start again)."""
    from ktd.core.loglines import Seam
    from ktd.frontend.ui.hub import LogLines, Viewer

    v = Viewer("m")
    v.seam = Seam(upto=3)
    assert v.fresh(LogLines(2, ["a", "x"])) == []
    assert v.fresh(LogLines(3, ["x"])) == []
    assert v.fresh(LogLines(4, ["x"])) == ["x"]
    assert v.fresh(LogLines(1, ["restarted"])) == ["restarted"]
    v.seam = Seam()  # a daemon that does not count: everything passes
    assert v.fresh(LogLines(0, ["z"])) == ["z"]


async def test_a_pull_event_moves_its_job_in_the_view_and_bad_frames_are_ignored() -> None:
    """``pull.`` events carry the job: the view every page holds changes with no request
    to the daemon; a frame that is not an event, or an event without a job, changes
    nothing (the frontend never dies of what it is sent)."""
    import json
    import types

    import msgspec

    from ktd import protocol as p
    from ktd.pullwire import PullInfo

    broker: Any = types.SimpleNamespace(endpoint="ipc:///nonexistent/control.sock")
    hub = hubmod.Hub(broker, upstream=None, metrics=None)  # type: ignore[arg-type]
    viewer = hub.join(logs=None)

    def event(done: int) -> list[bytes]:
        job = PullInfo(repo="org/a", revision="main", state="running", phase="fetch",
                       total=400, done=done, rate=10.0, eta=1.0)  # fmt: skip
        ev = p.Event(topic="pull.org/a@main", time=0.0, alias="org/a", state="running", pull=job)
        return [b"pull.org/a@main", msgspec.msgpack.encode(ev)]

    def pulls_pushed() -> list[list[dict[str, Any]]]:
        out = []
        while True:
            try:
                item = viewer.recv.receive_nowait()
            except trio.WouldBlock:
                return out
            assert isinstance(item, bytes) and item.startswith(b"event: view\n")
            data = item.split(b"data: ", 1)[1]
            out.append(json.loads(data)["view"]["pulls"])

    hub._on_event(event(100))
    hub._on_event(event(300))
    assert [[(j["key"], j["done"], j["fraction"]) for j in v] for v in pulls_pushed()] == [
        [("org/a@main", 100, 0.25)],
        [("org/a@main", 300, 0.75)],
    ]
    no_job = p.Event(topic="pull.org/b@main", time=0.0, alias="org/b", state="running")
    for frames in ([b"pull.org/a@main", b"\xc1 not msgpack"], [b"pull.x"],
                   [b"pull.org/b@main", msgspec.msgpack.encode(no_job)]):  # fmt: skip
        hub._on_event(frames)
    hub._on_event(event(300))  # the same job again: the view did not change, nothing pushed
    assert pulls_pushed() == []
    hub.leave(viewer)
