"""Fixtures for in-process frontend tests: a fake daemon, a fake engine, the app."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.trio import serve

from ktd.core.config import FrontendSection
from ktd.frontend.app import create_app
from ktd.frontend.main import hypercorn_config
from ktd.frontend.state import FrontendOptions
from tests.conftest import TLS
from tests.frontend.frontend_fakes import FakeDaemon, FakeEngine
from tests.frontend.frontend_helpers import Frontend, StartFrontend, free_port


@pytest.fixture
async def fake_daemon(runtime_dir: Path, nursery: trio.Nursery) -> FakeDaemon:
    daemon = FakeDaemon(f"ipc://{runtime_dir}/control.sock")
    await nursery.start(daemon.run)
    return daemon


@pytest.fixture
async def fake_engine(nursery: trio.Nursery) -> FakeEngine:
    engine = FakeEngine()
    await nursery.start(engine.run)
    return engine


@pytest.fixture
async def start_frontend(runtime_dir: Path, nursery: trio.Nursery) -> AsyncIterator[StartFrontend]:
    started: list[Frontend] = []

    async def start(
        endpoint: str | None = None,
        *,
        stream_grace: float = 0.3,
        heartbeat_interval: float = 0.5,
        ui_sample_interval: float = 10.0,
        ping_timeout: float = 2.0,
        **section: Any,
    ) -> Frontend:
        options = FrontendOptions(
            frontend=FrontendSection(bind="127.0.0.1:0", **section),
            control_endpoint=endpoint or f"ipc://{runtime_dir}/control.sock",
            heartbeat_interval=heartbeat_interval,
            loading_interval=0.5,
            stream_grace=stream_grace,
            ui_sample_interval=ui_sample_interval,
            ping_timeout=ping_timeout,
        )
        app = create_app(options)
        # The server as `ktd frontend` configures it (backlog, keep-alive, error log).
        hc = hypercorn_config(
            "127.0.0.1:0",
            graceful_timeout=1.0,
            access_log=False,
            idle_timeout=options.frontend.idle_timeout,
        )
        scope = trio.CancelScope()
        shutdown = trio.Event()

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            with scope:
                await serve(app, hc, shutdown_trigger=shutdown.wait, task_status=task_status)

        binds: list[str] = await nursery.start(run)
        fe = Frontend(
            url=binds[0], state=app.extensions["ktd"], scope=scope, shutdown=shutdown, app=app
        )
        started.append(fe)
        # Let the first heartbeat land so the broker knows the daemon is up.
        with trio.move_on_after(2):
            while fe.state.broker._alive is None:
                await trio.sleep(0.01)
        return fe

    yield start
    for fe in started:
        fe.scope.cancel()


# ---------------------------------------------------------------- real processes


@dataclass
class FrontendProc:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"frontend ignored {sig}:\n{self.output()}") from None
        return self.proc.returncode


def wait_http(
    url: str, proc: subprocess.Popen[bytes], output: Callable[[], str], *, uds: str | None = None
) -> None:
    deadline = time.monotonic() + 20
    transport = httpx.HTTPTransport(uds=uds) if uds else None
    with httpx.Client(transport=transport, timeout=1, verify=TLS) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}:\n{output()}")
            try:
                # Its own series, not just any answer: free_port() can race another test's
                # server for the port, and a frontend that could not bind exits 1.
                # (With keys set, /metrics asks for one: that answer is ktd's too.)
                text = client.get(url + "/metrics").text
                if "ktd_frontend_" in text or '"missing_api_key"' in text:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise AssertionError(f"{url} did not come up:\n{output()}")


def launch_frontend(
    config: Path,
    env: dict[str, str],
    log_path: Path,
    *,
    port: int | None = None,
    unix: Path | None = None,
    args: tuple[str, ...] = (),
) -> FrontendProc:
    """``ktd frontend`` as a process on ``127.0.0.1:port`` (a free one by default) or on
    ``unix:PATH``, its output in ``log_path``; returns once it answers HTTP."""
    port = port or free_port()
    bind = f"unix:{unix}" if unix else f"127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ktd", "frontend"),
                *("--config", str(config), "--bind", bind, *args),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    url = "http://localhost" if unix else f"http://127.0.0.1:{port}"
    fe = FrontendProc(url=url, proc=proc, log_path=log_path)
    try:
        wait_http(fe.url, proc, fe.output, uds=str(unix) if unix else None)
    except BaseException:
        fe.stop()
        raise
    return fe


@pytest.fixture
def frontend_factory(tmp_path: Path, ktd_env: dict[str, str]) -> Iterator[Any]:
    started: list[FrontendProc] = []

    def start(
        config: Path,
        *,
        env: dict[str, str] | None = None,
        port: int | None = None,
        unix: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> FrontendProc:
        """A frontend on ``127.0.0.1:port`` (a free one by default), or on ``unix:PATH``."""
        log_path = tmp_path / f"frontend-{len(started)}.log"
        fe = launch_frontend(config, env or ktd_env, log_path, port=port, unix=unix, args=args)
        started.append(fe)
        return fe

    yield start
    for fe in started:
        fe.stop()
