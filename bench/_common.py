"""Shared pieces of the benchmarks: a throw-away ktd stack, process accounting, a client.

Not a test module and not part of the package: each ``bench/*.py`` script
imports it from its own directory. Everything a benchmark starts is stopped in
``Stack.close()`` (also on Ctrl-C and on the script's own time limit, see
``time_limit``), and every process is bounded in count and time.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ktctl import Client  # noqa: E402
from ktd.sim.model import make_model  # noqa: E402

SHIM = REPO / "ktd" / "sim" / "shim"
SIM_MODELS = Path(tempfile.gettempdir()) / f"ktdb-models-{os.getpid()}"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- small helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(pred: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(step)
    raise SystemExit(f"bench: timed out waiting for {what}")


def pct(data: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); NaN for no data."""
    if not data:
        return float("nan")
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """The whole script ends after ``seconds`` (SIGALRM -> SystemExit, so cleanups run)."""

    def expired(signum: int, frame: object) -> None:
        raise SystemExit(f"bench: time limit of {seconds:g}s reached")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def raise_fd_limit(want: int) -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, want), hard)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


# ---------------------------------------------------------------- /proc accounting


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of these processes (all their threads), from /proc; gone ones count 0."""
    total = 0
    for pid in pids:
        try:
            fields = _stat(pid)
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (scan of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat(int(entry))[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


# ---------------------------------------------------------------- the ktd stack


def sim_model(alias: str, **env: object) -> dict[str, Any]:
    """A models.json entry whose engine is the sim (through the sglang shim)."""
    full = {
        "PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))),
        "KTD_SIM_LOAD_TIME": "0.1",
    }
    full.update({k: str(v) for k, v in env.items()})
    # Preflight refuses model paths that do not exist: stand-in dirs, removed at exit.
    if not SIM_MODELS.exists():
        atexit.register(shutil.rmtree, SIM_MODELS, ignore_errors=True)
    path, weights = make_model(SIM_MODELS, alias)
    return {
        "path": path,
        "backend": "kt",
        "alias": alias,
        "numa": "none",  # one NUMA node here: two engines must not evict each other
        "kt": {"kt_weight_path": weights, "extra_env": full},
    }


class Stack:
    """``ktd serve`` (+ ``ktd frontend``) on a temp config; ``close()`` stops all of it."""

    def __init__(
        self,
        models: list[dict[str, Any]],
        *,
        frontend: bool = True,
        daemon: dict[str, Any] | None = None,
        frontend_args: Sequence[str] = (),
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ktdb-", dir="/tmp"))
        self.env = dict(os.environ)
        self.env["KTD_RUNTIME_DIR"] = str(self.root / "run")
        self.env["KTD_STATE_DIR"] = str(self.root / "state")
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), self.env.get("PYTHONPATH")) if p
        )
        self.env.pop("KTD_SOCKET", None)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.root / "models.json").write_text(json.dumps(models))
        config = {
            "models_file": "models.json",
            "daemon": {"stop_grace": 5, "drain_timeout": 5, **(daemon or {})},
            "frontend": {"bind": f"127.0.0.1:{self.port}"},
        }
        (self.root / "config.json").write_text(json.dumps(config))
        self.socket = self.root / "run" / "control.sock"
        self.log = open(self.root / "procs.log", "wb")  # noqa: SIM115
        self.daemon: subprocess.Popen[bytes] | None = None
        self.frontend: subprocess.Popen[bytes] | None = None
        cfg = ["--config", str(self.root / "config.json")]
        try:
            self.daemon = self._spawn([sys.executable, "-m", "ktd", "serve", *cfg])
            wait_for(lambda: Client(self.socket, timeout=0.5).ping(), 30, "the daemon")
            if frontend:
                self.frontend = self._spawn(
                    [sys.executable, "-m", "ktd", "frontend", *cfg, *frontend_args]
                )
                wait_for(self._health, 30, "the frontend")
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, env=self.env, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL
        )

    def _health(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")

    def client(self, timeout: float = 10.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def load(self, alias: str) -> str:
        """Load ``alias`` through the daemon; return its engine URL."""
        info = self.client(timeout=60).load(alias, timeout=60)
        if info.state != "ready" or not info.url:
            raise SystemExit(f"bench: {alias} did not load: {info.state} {info.reason}")
        return info.url

    def engine(self, alias: str) -> Any:
        return next(e for e in self.client().status() if e.alias == alias)

    def proxy_pids(self) -> list[int]:
        """Frontend and daemon: the processes whose CPU is the proxy's cost."""
        return [p.pid for p in (self.frontend, self.daemon) if p is not None]

    def output(self) -> str:
        try:
            return (self.root / "procs.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        for proc in (self.frontend, self.daemon):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.frontend, self.daemon):
            if proc is None:
                continue
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chat_body(model: str, tokens: int, *, stream: bool = True) -> bytes:
    return json.dumps(
        {
            "model": model,
            "stream": stream,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "benchmark"}],
        }
    ).encode()
