"""The real sglang-router (PyPI ``sglang-router``) on loopback, and ktd "hosts" around it.

A "host" is one ktd daemon with its own runtime and state directories and its
own config (its gateway section pointing at the router); two of them on this
machine stand for two machines behind one router. The router is a Python
launcher around a Rust library: one process, killed by its pid; it inherits
``KTD_TEST_RUN`` like everything else, so the leak check would catch a survivor.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TLS, ConfigWriter, DaemonProc, sim_model

ROUTER_BIN = Path(sys.executable).parent / "sglang-router"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RouterProc:
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RouterProc:
        argv = [
            str(ROUTER_BIN),
            "launch",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
            *("--policy", "round_robin"),
            *("--health-check-interval-secs", "1", "--health-check-timeout-secs", "2"),
            *("--shutdown-grace-period-secs", "1", "--log-level", "info"),
            *self.extra,
        ]
        env = dict(os.environ)
        env["HF_HUB_OFFLINE"] = "1"  # never reach for a tokenizer on the hub
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"router exited {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/liveness", timeout=1, verify=TLS).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"router did not come up:\n{self.output()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def workers(self) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/workers", timeout=5, verify=TLS)
        r.raise_for_status()
        return r.json()["workers"]  # type: ignore[no-any-return]


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProc]:
    if not ROUTER_BIN.exists():
        pytest.skip("sglang-router is not installed (pip install -e '.[test]')")
    r = RouterProc(port=free_port(), log_path=tmp_path / "router.log")
    try:
        yield r.start()
    finally:
        r.kill()


@dataclass
class FrontendProc:
    """``ktd frontend`` of one host, on the port its config names (the daemon advertises it)."""

    url: str
    config: Path
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FrontendProc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ktd", "frontend", "--config", str(self.config)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"frontend exited:\n{self.output()}"
            try:
                httpx.get(self.url + "/metrics", timeout=1, verify=TLS)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError(f"frontend did not come up:\n{self.output()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


@dataclass
class Host:
    name: str
    daemon: DaemonProc
    writer: ConfigWriter
    env: dict[str, str]
    frontend: FrontendProc | None = None

    def status(self) -> dict[str, Any]:
        return self.daemon.status_doc()

    def engine(self, alias: str) -> dict[str, Any]:
        return next(e for e in self.status()["engines"] if e["alias"] == alias)

    def engine_url(self, alias: str) -> str:
        url = self.engine(alias)["url"]
        assert url, self.engine(alias)
        return str(url)


@pytest.fixture
def hosts(tmp_path: Path, ktd_env: dict[str, str]) -> Iterator[Any]:
    """``make(name, models, gateway=...)`` → a started ``Host``; all stopped at the end."""
    made: list[Host] = []
    dirs: list[Path] = []

    def make(
        name: str,
        models: list[dict[str, Any]],
        *,
        gateway: dict[str, Any],
        frontend: dict[str, Any] | None = None,
        daemon: dict[str, Any] | None = None,
        with_frontend: bool = False,
    ) -> Host:
        run = Path(tempfile.mkdtemp(prefix=f"ktd-{name}-", dir="/tmp"))
        dirs.append(run)
        env = dict(ktd_env)
        env["KTD_RUNTIME_DIR"] = str(run / "run")
        env["KTD_STATE_DIR"] = str(tmp_path / f"state-{name}")
        writer = ConfigWriter(tmp_path / f"etc-{name}")
        frontend = dict(frontend or {})
        if with_frontend:
            frontend.setdefault("bind", f"127.0.0.1:{free_port()}")
        cfg = writer(models, daemon=daemon, frontend=frontend)
        doc = json.loads(cfg.read_text())
        doc["gateway"] = gateway
        cfg.write_text(json.dumps(doc, indent=2))
        d = DaemonProc(config=cfg, env=env, log_path=tmp_path / f"ktd-{name}.log")
        d.start()
        host = Host(name=name, daemon=d, writer=writer, env=env)
        made.append(host)
        if with_frontend:
            fe = FrontendProc(
                url=f"http://{frontend['bind']}",
                config=cfg,
                env=env,
                log_path=tmp_path / f"frontend-{name}.log",
            )
            host.frontend = fe.start()
        return host

    yield make
    for h in made:
        if h.frontend is not None:
            h.frontend.stop()
    for h in made:
        if h.daemon.proc is not None and h.daemon.proc.poll() is None:
            h.daemon.stop()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def model(alias: str, path: Path, **env: Any) -> dict[str, Any]:
    """A sim model whose ``model_path`` exists (the router then reads no tokenizer hub),
    with the config.json that preflight asks of a model dir."""
    from ktd.sim.model import make_model

    model_path, _ = make_model(path.parent, path.name)
    entry = sim_model(alias, env=env)
    entry["path"] = model_path
    return entry


class Load:
    """Steady traffic through the router from a few threads, counting what failed."""

    def __init__(self, url: str, model: str, *, concurrency: int = 4, max_tokens: int = 8) -> None:
        self.url = url
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _loop(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": self.max_tokens,
        }
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url + "/v1/chat/completions", json=body)
                    good = r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
                    err = None if good else f"{r.status_code} {r.text[:200]}"
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    err = repr(exc)
                with self._lock:
                    if err is None:
                        self.ok += 1
                    else:
                        self.failed.append(err)

    def __enter__(self) -> Load:
        for _ in range(self.concurrency):
            t = threading.Thread(target=self._loop, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def wait_ok(self, n: int, timeout: float = 30.0) -> None:
        start = self.ok
        deadline = time.monotonic() + timeout
        while self.ok - start < n:
            got = self.ok - start
            assert time.monotonic() < deadline, f"only {got} ok of {n}: {self.failed[-3:]}"
            time.sleep(0.02)
