"""Control plane: ``ktctl status`` start-up and ``ktctl.Client.status()`` round trips.

Starts ``ktd serve`` (no frontend) on a throw-away config with two sim models
(not loaded: status lists them either way), then, in one run:

1. a hyperfine-like loop, alternating the two commands ``--runs`` times each
   after ``--warmup`` untimed runs of each:
   ``ktctl --socket S status`` (the installed console script, else
   ``python -m ktctl``) and ``python3 -c 'import zmq, msgspec'`` (the floor:
   an interpreter that imports ktctl's two dependencies). Wall time of each
   process from fork to exit; ratio of the medians.
2. ``ktctl.Client.status()`` in a loop (one client, ``--calls`` calls after
   100 untimed ones): round-trip p50/p99.

Targets (issue #6): ktctl status < 1.5x the import floor; status() p50 < 0.3 ms.

    python bench/control_plane.py [--runs 30] [--calls 5000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, pct, sim_model, time_limit


def wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench: {argv} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return took


def describe(name: str, xs: list[float]) -> str:
    return (
        f"{name:<44} median {statistics.median(xs) * 1e3:7.1f} ms  "
        f"mean {statistics.fmean(xs) * 1e3:7.1f} ms +- {statistics.stdev(xs) * 1e3:5.1f}  "
        f"min {min(xs) * 1e3:6.1f}  max {max(xs) * 1e3:6.1f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--limit", type=float, default=300, help="hard limit on the whole run (s)")
    args = ap.parse_args()

    with (
        time_limit(args.limit),
        Stack([sim_model("cp-a"), sim_model("cp-b")], frontend=False) as stack,
    ):
        env = dict(stack.env)
        script = shutil.which("ktctl")
        ktctl = [script] if script else [sys.executable, "-m", "ktctl"]
        status_cmd = [*ktctl, "--socket", str(stack.socket), "status"]
        floor_cmd = ["python3", "-c", "import zmq, msgspec"]
        print(
            f"bench: {' '.join(status_cmd)}\n   vs: {' '.join(floor_cmd)}\n"
            f"  {args.runs} runs each (alternating, after {args.warmup} warm-up runs each); "
            f"then {args.calls} Client.status() calls",
            flush=True,
        )
        for _ in range(args.warmup):
            wall(status_cmd, env)
            wall(floor_cmd, env)
        st, fl = [], []
        for _ in range(args.runs):
            st.append(wall(status_cmd, env))
            fl.append(wall(floor_cmd, env))

        client = stack.client()
        for _ in range(100):
            client.status()
        rtt = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            client.status()
            rtt.append(time.perf_counter() - t0)
        client.close()

    print()
    print(describe("ktctl status", st))
    print(describe("python3 -c 'import zmq, msgspec'", fl))
    ratio = statistics.median(st) / statistics.median(fl)
    print(f"ratio of medians: {ratio:.2f}x")
    p50, p99 = pct(rtt, 0.5) * 1e3, pct(rtt, 0.99) * 1e3
    print(f"Client.status() round trip: p50 {p50:.3f} ms  p99 {p99:.3f} ms  ({len(rtt)} calls)")
    for what, ok, figure in (
        ("ktctl status < 1.5x import floor", ratio < 1.5, f"{ratio:.2f}x"),
        ("Client.status() p50 < 0.3 ms", p50 < 0.3, f"{p50:.3f} ms"),
    ):
        print(f"  {'MET' if ok else 'MISSED':<8} {what}: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
