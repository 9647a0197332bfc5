"""Fixtures for in-process frontend tests: a fake daemon, a fake engine, the app."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from frontend_fakes import FakeDaemon, FakeEngine
from hypercorn.trio import serve

from ktd.config import FrontendSection
from ktd.frontend.app import FrontendOptions, State, create_app


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ktdf-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def fake_daemon(short_dir: Path, nursery: trio.Nursery) -> FakeDaemon:
    daemon = FakeDaemon(f"ipc://{short_dir}/control.sock")
    await nursery.start(daemon.run)
    return daemon


@pytest.fixture
async def fake_engine(nursery: trio.Nursery) -> FakeEngine:
    engine = FakeEngine()
    await nursery.start(engine.run)
    return engine


@dataclass
class Frontend:
    url: str
    state: State
    scope: trio.CancelScope

    def client(self, **kw: Any) -> httpx.AsyncClient:
        kw.setdefault("timeout", 10.0)
        return httpx.AsyncClient(base_url=self.url, **kw)


StartFrontend = Callable[..., Awaitable[Frontend]]


@pytest.fixture
async def start_frontend(short_dir: Path, nursery: trio.Nursery) -> AsyncIterator[StartFrontend]:
    started: list[Frontend] = []

    async def start(
        endpoint: str | None = None, *, stream_grace: float = 0.3, **section: Any
    ) -> Frontend:
        from hypercorn.config import Config as HyperConfig

        options = FrontendOptions(
            frontend=FrontendSection(bind="127.0.0.1:0", **section),
            control_endpoint=endpoint or f"ipc://{short_dir}/control.sock",
            heartbeat_interval=0.5,
            loading_interval=0.5,
            stream_grace=stream_grace,
        )
        app = create_app(options)
        hc = HyperConfig()
        hc.bind = ["127.0.0.1:0"]
        hc.graceful_timeout = 1.0
        hc.errorlog = None
        hc.accesslog = None
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            with scope:
                await serve(app, hc, task_status=task_status)

        binds: list[str] = await nursery.start(run)
        fe = Frontend(url=binds[0], state=app.extensions["ktd"], scope=scope)
        started.append(fe)
        # Let the first heartbeat land so the broker knows the daemon is up.
        with trio.move_on_after(2):
            while fe.state.broker._alive is None:
                await trio.sleep(0.01)
        return fe

    yield start
    for fe in started:
        fe.scope.cancel()


async def wait_for(pred: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    with trio.move_on_after(timeout):
        while not pred():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what or pred}")


__all__ = ["Frontend", "StartFrontend", "wait_for"]
