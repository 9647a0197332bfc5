"""The usage ledger's cost per report: this checkout's store against another's, in one run.

The daemon adds each frontend's usage batch (from its claim report) to the ledger and
makes it durable before it answers, inside the control socket's pump: whatever that
costs delays every control request behind it. The cost depends on what the ledger
already holds, so each side starts from the same ledger: ``--days`` days of ``--keys``
keys x ``--models`` models (366 x 20 x 10: a busy year, 73,200 rows), on this box's own
disk (a state directory under ``--dir``), and then takes ``--reports`` reports of a
3-row batch for today, timed one by one (``report()`` returns once the batch is on disk).

The two sides alternate, ``--rounds`` times, each in its own process with its own
checkout on ``PYTHONPATH`` (``--before DIR``: a ``git worktree`` of the older commit), so
load on the shared machine falls on both alike. Printed: p50 and p99 per report and the
ratio of this checkout's to the other's.

    python bench/usage_store.py --before /tmp/ktd-before [--days 366] [--keys 20]
                                [--models 10] [--reports 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# Run in each side's process (its own checkout first on sys.path): build, then time.
CHILD = r"""
import json, sys, time
from pathlib import Path
from ktd import protocol as p
from ktd.core import usage as u
from ktd.daemon.pool.usage import UsageStore

state, days, keys, models, reports = sys.argv[1], *map(int, sys.argv[2:6])
path = Path(state) / "usage.json"
now = 1_796_000_000.0
first = UsageStore(path, clock=lambda: now)
rows = [
    p.UsageCount(day=u.days_before(u.day_of(now), d), key=f"key-{k}", model=f"model-{m}",
                 requests=3, prompt=300, completion=700)
    for d in range(days) for k in range(keys) for m in range(models)
]
first.report("seed", 1, rows)  # the year, as one batch: written by either store
store = UsageStore(path, clock=lambda: now)  # a daemon's start, with the year on disk
batch = [p.UsageCount(day=u.day_of(now), key=f"key-{k}", model="model-0", requests=1,
                      prompt=10, completion=20) for k in range(3)]
took = []
for seq in range(1, reports + 1):
    t0 = time.perf_counter()
    store.report("fe", seq, batch)
    took.append(time.perf_counter() - t0)
assert store.acked("fe") == reports
print(json.dumps({"took": took, "bytes": sum(f.stat().st_size for f in Path(state).iterdir())}))
"""


def run_side(checkout: Path, args: argparse.Namespace, base: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=base) as state:
        env = dict(os.environ, PYTHONPATH=str(checkout))
        argv = [sys.executable, "-c", CHILD, state]
        argv += [str(args.days), str(args.keys), str(args.models), str(args.reports)]
        out = subprocess.run(argv, env=env, cwd=checkout, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"bench: {checkout}: {out.stderr[-2000:]}")
        result: dict[str, object] = json.loads(out.stdout)
        return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout")
    ap.add_argument("--days", type=int, default=366)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--reports", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=HERE, help="where the state dirs go (a disk)")
    args = ap.parse_args()
    sides = {"ktd": HERE, "before": args.before.resolve()}
    took: dict[str, list[float]] = {name: [] for name in sides}
    size: dict[str, int] = {}
    rows = args.days * args.keys * args.models
    print(
        f"bench: {rows} rows ({args.days} days x {args.keys} keys x {args.models} models), "
        f"{args.reports} reports of 3 rows, {args.rounds} round(s), state under {args.dir}"
    )
    t0 = time.monotonic()
    for n in range(args.rounds):
        for name, checkout in sides.items():
            got = run_side(checkout, args, args.dir)
            took[name] += got["took"]  # type: ignore[arg-type]
            size[name] = got["bytes"]  # type: ignore[assignment]
        print(
            f"  round {n + 1}: "
            + "  ".join(
                f"{name} p50 {statistics.median(v) * 1e3:.2f} ms" for name, v in took.items()
            )
        )
    print(f"\n{'side':8} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'files KB':>9}")
    for name, values in took.items():
        print(
            f"{name:8} {statistics.median(values) * 1e3:9.2f} {pct(values, 0.99) * 1e3:9.2f} "
            f"{statistics.fmean(values) * 1e3:9.2f} {size[name] / 1024:9.0f}"
        )
    ratio = statistics.median(took["ktd"]) / statistics.median(took["before"])
    mean = statistics.fmean(took["ktd"]) / statistics.fmean(took["before"])
    print(f"\nktd / before: p50 {ratio:.3f}x, mean {mean:.3f}x ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
