"""Idle cost: daemon + frontend with two engines loaded, doing nothing.

Starts ``ktd serve`` + ``ktd frontend`` with two sim models, loads both (one
request each through the frontend, so the lease path and the upstream pool
have been used), lets things settle for ``--settle`` seconds, then reads the
CPU time (utime+stime from /proc) of the daemon and of the frontend over
``--seconds`` seconds. The sims' own CPU is shown for reference (it is the
engines' cost, not ktd's).

Target (issue #6): daemon + frontend < 0.5% of one core.

    python bench/idle.py [--seconds 30] [--settle 3]
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Stack,
    chat_body,
    cpu_seconds,
    descendants,
    sim_model,
    time_limit,
)


def one_request(port: int, model: str) -> None:
    body = chat_body(model, 2, stream=False)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    if not reply.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"bench: request for {model} failed: {reply[:300]!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--limit", type=float, default=180, help="hard limit on the whole run (s)")
    args = ap.parse_args()

    with time_limit(args.limit), Stack([sim_model("idle-a"), sim_model("idle-b")]) as stack:
        assert stack.frontend is not None and stack.daemon is not None
        for alias in ("idle-a", "idle-b"):
            one_request(stack.port, alias)
        engines = [e for e in stack.client().status() if e.state == "ready"]
        if len(engines) != 2:
            raise SystemExit(f"bench: expected 2 engines ready, got {[e.alias for e in engines]}")
        sims = [q for e in engines for q in descendants(e.pid)]
        time.sleep(args.settle)
        fe, dm = stack.frontend.pid, stack.daemon.pid
        f0, d0, s0 = cpu_seconds([fe]), cpu_seconds([dm]), cpu_seconds(sims)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        took = time.monotonic() - t0
        f1, d1, s1 = cpu_seconds([fe]), cpu_seconds([dm]), cpu_seconds(sims)
        still = [e.alias for e in stack.client().status() if e.state == "ready"]

    def share(cpu: float) -> str:
        return f"{cpu:6.3f} s = {cpu / took * 100:6.3f}% of a core"

    print(f"bench: idle for {took:.1f} s with 2 engines loaded ({', '.join(still)} still ready)\n")
    print(f"  daemon             {share(d1 - d0)}")
    print(f"  frontend           {share(f1 - f0)}")
    total = (d1 - d0) + (f1 - f0)
    print(f"  daemon + frontend  {share(total)}")
    print(f"  (the two sims      {share(s1 - s0)})")
    pct = total / took * 100
    verdict = "MET" if pct < 0.5 else "MISSED"
    print(f"  {verdict:<8} daemon + frontend idle < 0.5% of a core: {pct:.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
