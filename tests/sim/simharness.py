"""Run the simulated engine as a real subprocess, and clean up after it.

Every sim runs in its own session (``start_new_session=True``) and is killed
with ``os.killpg`` when the test ends; a grandchild that escaped the session
(``KTD_SIM_ESCAPE``) is found through the start-up record and killed too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import TLS, own_env

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "ktd" / "sim" / "shim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class SimProc:
    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, log_path: Path, record_path: Path
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.port = port
        self.log_path = log_path
        self.record_path = record_path
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.record_path.read_text())
        return data

    def wait_log(self, text: str, timeout: float = 10) -> None:
        wait_until(lambda: text in self.log(), timeout, f"{text!r} in the sim log")

    def wait_ready(self, timeout: float = 10) -> None:
        with httpx.Client(timeout=1, verify=TLS) as client:  # one client for the whole poll

            def healthy() -> bool:
                try:
                    return client.get(self.url("/health")).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(healthy, timeout, "/health 200")

    def wait_exit(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout=timeout)

    def escaped_pid(self) -> int | None:
        try:
            pid = self.record().get("escaped_pid")
        except (OSError, ValueError):
            return None
        return pid if isinstance(pid, int) else None

    def kill(self) -> None:
        escaped = self.escaped_pid()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if escaped is not None and alive(escaped):
            try:
                with open(f"/proc/{escaped}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                comm = ""
            if comm.startswith("sglang::"):
                os.kill(escaped, signal.SIGKILL)


def start_sim(
    tmp: Path,
    *,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    shim: bool = False,
    port: int | None = None,
    model: str = "/models/Sim-MoE",
    served: str | None = "sim-model",
    ctx: int | None = 512,
) -> SimProc:
    port = free_port() if port is None else port
    log_path = tmp / f"sim-{port}.log"
    record_path = tmp / f"sim-{port}.json"
    full_env = own_env()
    full_env.update({"KTD_SIM_LOAD_TIME": "0.2", "KTD_SIM_WARMUP": "0.05"})
    full_env["KTD_SIM_RECORD"] = str(record_path)
    full_env.update(env or {})
    argv = ["--host", "127.0.0.1", "--port", str(port), "--model", model]
    if served is not None:
        argv += ["--served-model-name", served]
    if ctx is not None:
        argv += ["--context-length", str(ctx)]
    argv += list(args)
    if shim:
        full_env["PYTHONPATH"] = str(SHIM)  # only the shim: it must find ktd by itself
        cmd = [sys.executable, "-m", "sglang.launch_server", *argv]
        cwd = tmp  # not the repo, so `python -m` cannot find ktd through the cwd
    else:
        old = full_env.get("PYTHONPATH")
        full_env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
        cmd = [sys.executable, "-m", "ktd.sim", *argv]
        cwd = REPO
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return SimProc(proc, port, log_path, record_path)
