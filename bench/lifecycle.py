"""Lifecycle overhead: sim healthy -> ktd ``ready``, and evict -> port free.

Starts ``ktd serve`` (no frontend) with one sim model, then ``--loads`` times:

1. ``load --no-wait``; as soon as the engine's port is known a thread here
   polls the sim's ``/health`` every millisecond; the first 200 it sees is
   "the sim is healthy". The daemon's ``engine.<alias>`` event with state
   ``ready`` carries the daemon's own wall-clock time; ready latency = that
   time minus the first 200 (the sim logs "ready to roll" at the instant
   ``/health`` turns 200, and ktd follows the log with inotify).
2. ``evict``: a thread polls every millisecond for the engine's processes to be
   gone and its port to be bindable; "evict -> port free" is measured from the
   call. The same sim command line (ktd's own argv for it, on another port)
   is then started here directly and SIGTERMed as a process group, which is
   what ktd does at the end of an evict: "SIGTERM -> port free" of the bare sim
   is its own exit time, and the difference is ktd's overhead.

Targets (issue #6): ready latency p50 < 100 ms; evict overhead reported.

    python bench/lifecycle.py [--loads 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Stack,
    descendants,
    free_port,
    pct,
    port_free,
    sim_model,
    time_limit,
)

ALIAS = "lc"


def first_healthy(port: int, deadline: float, out: list[float]) -> None:
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                if s.recv(16).startswith(b"HTTP/1.1 200"):
                    out.append(time.time())
                    return
        except OSError:
            pass
        time.sleep(0.001)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def watch_exit(pids: list[int], port: int, stop: threading.Event, out: dict[str, float]) -> None:
    while not stop.is_set() and ("gone" not in out or "port" not in out):
        now = time.time()
        if "gone" not in out and not any(alive(p) for p in pids):
            out["gone"] = now
        if "port" not in out and port_free(port):
            out["port"] = now
        time.sleep(0.001)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loads", type=int, default=10)
    ap.add_argument("--limit", type=float, default=300, help="hard limit on the whole run (s)")
    args = ap.parse_args()

    model = sim_model(ALIAS, KTD_SIM_LOAD_TIME=0.2, KTD_SIM_WARMUP=0.3)
    ready_lat: list[float] = []
    evict_port: list[float] = []
    evict_gone: list[float] = []
    evict_call: list[float] = []
    bare_port: list[float] = []
    bare_gone: list[float] = []
    with time_limit(args.limit), Stack([model], frontend=False) as stack:
        client = stack.client(timeout=30)
        sub = client.subscribe([f"engine.{ALIAS}"], exact=True)
        time.sleep(0.3)  # zmq subscriptions take effect asynchronously
        argv: list[str] = []
        for _ in range(args.loads):
            client.load(ALIAS, wait=False)
            port = None
            deadline = time.time() + 30
            while port is None and time.time() < deadline:
                port = stack.engine(ALIAS).port
                if port is None:
                    time.sleep(0.002)
            assert port is not None, "engine has no port"
            healthy: list[float] = []
            poller = threading.Thread(target=first_healthy, args=(port, deadline, healthy))
            poller.start()
            ready_at = None
            while ready_at is None and time.time() < deadline:
                ev = sub.get(0.1)
                if ev is not None and ev.state == "ready":
                    ready_at = ev.time
                elif ev is not None and ev.state == "failed":
                    raise SystemExit(f"bench: load failed: {ev.reason}\n{stack.output()}")
            poller.join()
            if ready_at is None or not healthy:
                raise SystemExit(f"bench: no ready event / health\n{stack.output()}")
            ready_lat.append(ready_at - healthy[0])

            info = stack.engine(ALIAS)
            argv = list(info.argv)
            pids = descendants(info.pid)
            out: dict[str, float] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=watch_exit, args=(pids, port, stop, out))
            t0 = time.time()
            watcher.start()
            client.evict(ALIAS)
            t1 = time.time()
            watcher.join(10)
            stop.set()
            evict_call.append(t1 - t0)
            evict_gone.append(out.get("gone", float("nan")) - t0)
            evict_port.append(out.get("port", float("nan")) - t0)
            while (ev := sub.get(0.05)) is not None and ev.state != "stopped":
                pass

        # The bare sim, same argv and environment, SIGTERMed as a group.
        env = dict(os.environ)
        env.update(model["kt"]["extra_env"])
        env.pop("KTD_SIM_RECORD", None)
        for _ in range(args.loads):
            port = free_port()
            cmd = list(argv)
            cmd[cmd.index("--port") + 1] = str(port)
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                healthy = []
                first_healthy(port, time.time() + 30, healthy)
                if not healthy:
                    raise SystemExit("bench: the bare sim did not become healthy")
                pids = descendants(proc.pid)
                out = {}
                stop = threading.Event()
                watcher = threading.Thread(target=watch_exit, args=(pids, port, stop, out))
                t0 = time.time()
                watcher.start()
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
                watcher.join(10)
                stop.set()
                bare_gone.append(out.get("gone", float("nan")) - t0)
                bare_port.append(out.get("port", float("nan")) - t0)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        sub.close()
        client.close()

    def ms(xs: list[float], q: float) -> str:
        return f"{pct(xs, q) * 1e3:8.1f} ms"

    print(f"bench: {args.loads} loads and evicts of a sim (load 0.2 s, warm-up 0.3 s)\n")
    rows: list[tuple[str, list[float]]] = [
        ("sim healthy -> ktd ready event", ready_lat),
        ("ktd evict: call -> processes gone", evict_gone),
        ("ktd evict: call -> port free", evict_port),
        ("ktd evict: call -> reply", evict_call),
        ("bare sim: SIGTERM -> processes gone", bare_gone),
        ("bare sim: SIGTERM -> port free", bare_port),
    ]
    print(f"{'':<38}{'p50':>11}{'p99':>11}{'max':>11}")
    for name, xs in rows:
        print(f"{name:<38}{ms(xs, 0.5)}{ms(xs, 0.99)}{max(xs) * 1e3:8.1f} ms")
    print("\nbeyond the bare sim's own exit (p50 minus p50):")
    for what, ktd, bare in (
        ("port free", evict_port, bare_port),
        ("processes gone", evict_gone, bare_gone),
        ("evict reply vs processes gone", evict_call, bare_gone),
    ):
        print(f"  {what:<32}{(pct(ktd, 0.5) - pct(bare, 0.5)) * 1e3:+8.1f} ms")
    r50 = pct(ready_lat, 0.5) * 1e3
    print(f"  {'MET' if r50 < 100 else 'MISSED':<8} ready latency p50 < 100 ms: {r50:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
