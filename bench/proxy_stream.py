"""Streaming through the frontend vs straight to the engine, in one run.

Starts ``ktd serve`` and ``ktd frontend`` on a throw-away config whose one
model is the simulated engine at full speed (``KTD_SIM_TOKEN_RATE=0``), loads
it, then runs the same streaming load twice: straight at the engine's port, and
through the frontend. Prints requests/s, chunks/s and time-to-first-byte for
both, the ratios, and the frontend's CPU time per 1000 chunks (the number a
later issue compares against nginx).

The load generator is trio + h11 on raw sockets with keep-alive (one
connection per worker), in this process; the frontend and the engine are other
processes. It is not part of the test suite.

    python bench/proxy_stream.py [--concurrency 32] [--tokens 64] [--requests 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import h11
import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ktctl import Client  # noqa: E402

ALIAS = "bench"


@dataclass
class Result:
    name: str
    seconds: float = 0.0
    requests: int = 0
    chunks: int = 0
    errors: int = 0
    ttfb: list[float] = field(default_factory=list)
    cpu: float | None = None

    def pct(self, q: float) -> float:
        if not self.ttfb:
            return float("nan")
        data = sorted(self.ttfb)
        return data[min(len(data) - 1, int(q * len(data)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its threads, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def one_stream(
    stream: trio.SocketStream, conn: h11.Connection, host: str, path: str, body: bytes
) -> tuple[int, float]:
    """One request on a keep-alive connection; returns (events, ttfb)."""
    t0 = trio.current_time()
    req = h11.Request(
        method="POST",
        target=path,
        headers=[
            ("host", host),
            ("content-type", "application/json"),
            ("accept", "text/event-stream"),
            ("content-length", str(len(body))),
        ],
    )
    await stream.send_all(
        conn.send(req) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    )
    ttfb = 0.0
    events = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.Response):
            if event.status_code != 200:
                raise RuntimeError(f"HTTP {event.status_code}")
        elif isinstance(event, h11.Data):
            if not ttfb and b"data: {" in event.data:
                ttfb = trio.current_time() - t0
            events += event.data.count(b"data: ")
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return events, ttfb
        elif isinstance(event, h11.ConnectionClosed):
            raise RuntimeError("connection closed")


async def run_load(name: str, base: str, *, concurrency: int, requests: int, tokens: int) -> Result:
    url = urlsplit(base)
    host = url.netloc
    body = json.dumps(
        {
            "model": ALIAS,
            "stream": True,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "benchmark"}],
        }
    ).encode()
    result = Result(name)
    todo = iter(range(requests))

    async def worker() -> None:
        stream: trio.SocketStream | None = None
        conn = h11.Connection(h11.CLIENT)
        for _ in todo:
            try:
                if stream is None:
                    stream = await trio.open_tcp_stream(url.hostname or "127.0.0.1", url.port or 80)
                    conn = h11.Connection(h11.CLIENT)
                events, ttfb = await one_stream(stream, conn, host, "/v1/chat/completions", body)
            except (OSError, RuntimeError, h11.ProtocolError, trio.BrokenResourceError):
                result.errors += 1
                if stream is not None:
                    await stream.aclose()
                stream = None
                continue
            result.requests += 1
            result.chunks += events
            result.ttfb.append(ttfb)
        if stream is not None:
            await stream.aclose()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    result.seconds = trio.current_time() - t0
    return result


def wait_for(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens = chunks per stream")
    ap.add_argument("--requests", type=int, default=1024, help="streams per run")
    ap.add_argument("--rounds", type=int, default=2, help="alternate direct/frontend this often")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ktd-bench-", dir="/tmp"))
    env = dict(os.environ)
    env["KTD_RUNTIME_DIR"] = str(root / "run")
    env["KTD_STATE_DIR"] = str(root / "state")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("KTD_SOCKET", None)
    port = free_port()
    models = [
        {
            "path": "/models/bench",
            "backend": "kt",
            "alias": ALIAS,
            "kt": {
                "kt_weight_path": "/models/bench-kt",
                "extra_env": {
                    "PYTHONPATH": str(REPO / "ktd" / "sim" / "shim"),
                    "KTD_SIM_LOAD_TIME": "0.1",
                    "KTD_SIM_TOKEN_RATE": "0",
                },
            },
        }
    ]
    (root / "models.json").write_text(json.dumps(models))
    (root / "config.json").write_text(
        json.dumps(
            {
                "models_file": "models.json",
                "daemon": {"stop_grace": 5, "drain_timeout": 5},
                "frontend": {"bind": f"127.0.0.1:{port}"},
            }
        )
    )
    cfg = ["--config", str(root / "config.json")]
    logs = open(root / "procs.log", "wb")  # noqa: SIM115
    procs = []
    try:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "ktd", "serve", *cfg], env=env, stdout=logs, stderr=logs
        )
        procs.append(daemon)
        sock = root / "run" / "control.sock"
        wait_for(lambda: Client(sock, timeout=0.5).ping(), 30, "the daemon")
        frontend = subprocess.Popen(
            [sys.executable, "-m", "ktd", "frontend", *cfg], env=env, stdout=logs, stderr=logs
        )
        procs.append(frontend)
        fe_url = f"http://127.0.0.1:{port}"
        import httpx

        wait_for(lambda: httpx.get(fe_url + "/health").status_code == 200, 30, "the frontend")
        # Load the engine through the frontend, then find its port.
        r = httpx.post(
            fe_url + "/v1/chat/completions",
            json={"model": ALIAS, "messages": [], "max_tokens": 2},
            timeout=120,
        )
        r.raise_for_status()
        engine = next(e for e in Client(sock).status() if e.alias == ALIAS)
        assert engine.url is not None
        print(
            f"bench: {args.requests} streams x {args.tokens} tokens, "
            f"concurrency {args.concurrency}, {args.rounds} round(s)\n"
            f"  engine (sim) {engine.url}  frontend {fe_url}\n"
        )

        async def all_runs() -> list[Result]:
            out = []
            kw = {"concurrency": args.concurrency, "requests": args.requests, "tokens": args.tokens}
            # warm-up (connections, caches) on both paths
            await run_load("warmup", engine.url or "", concurrency=4, requests=16, tokens=8)
            await run_load("warmup", fe_url, concurrency=4, requests=16, tokens=8)
            for _ in range(args.rounds):
                c0 = cpu_seconds(frontend.pid)
                d = await run_load("direct", engine.url or "", **kw)
                d.cpu = cpu_seconds(frontend.pid) - c0
                c0 = cpu_seconds(frontend.pid)
                f = await run_load("frontend", fe_url, **kw)
                f.cpu = cpu_seconds(frontend.pid) - c0
                out += [d, f]
            return out

        results = trio.run(all_runs)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        logs.close()
        shutil.rmtree(root, ignore_errors=True)

    print(f"{'run':<10}{'req/s':>10}{'chunks/s':>12}{'ttfb p50':>11}{'ttfb p99':>11}{'errors':>8}")
    for res in results:
        print(
            f"{res.name:<10}{res.requests / res.seconds:>10.1f}{res.chunks / res.seconds:>12.0f}"
            f"{res.pct(0.5) * 1e3:>9.2f}ms{res.pct(0.99) * 1e3:>9.2f}ms{res.errors:>8}"
        )
    direct = [r for r in results if r.name == "direct"]
    front = [r for r in results if r.name == "frontend"]
    best_d = max(direct, key=lambda r: r.requests / r.seconds)
    best_f = max(front, key=lambda r: r.requests / r.seconds)
    d_ttfb = [t for r in direct for t in r.ttfb]
    f_ttfb = [t for r in front for t in r.ttfb]
    q = statistics.quantiles
    d50, d99 = q(d_ttfb, n=100)[49], q(d_ttfb, n=100)[98]
    f50, f99 = q(f_ttfb, n=100)[49], q(f_ttfb, n=100)[98]
    fe_chunks = sum(r.chunks for r in front)
    fe_cpu = sum(r.cpu or 0.0 for r in front)
    print()
    req_ratio = (best_f.requests / best_f.seconds) / (best_d.requests / best_d.seconds)
    chunk_ratio = (best_f.chunks / best_f.seconds) / (best_d.chunks / best_d.seconds)
    print(f"frontend/direct requests/s: {req_ratio:.2f}")
    print(f"frontend/direct chunks/s:   {chunk_ratio:.2f}")
    for label, d, f in (("p50", d50, f50), ("p99", d99, f99)):
        print(
            f"time to first byte {label}: {d * 1e3:.2f} -> {f * 1e3:.2f} ms "
            f"(x{f / d:.2f}, +{(f - d) * 1e3:.2f} ms)"
        )
    per_chunk = fe_cpu / max(fe_chunks, 1) * 1e6
    print(f"frontend CPU: {fe_cpu:.2f} s for {fe_chunks} chunks = {per_chunk:.1f} us/chunk")
    print("(frontend CPU includes per-request work; vary --tokens to separate the two)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
