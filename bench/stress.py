"""Flakes are races: run a slice of the suite many times with the CPU loaded, count failures.

A test that fails one run in a dozen under load passes a single run of the suite most of
the time, so one green run proves little. This runs a pytest selection ``--runs`` times,
``--parallel`` runs at a time, while ``--burners`` processes spin on the CPU (this box
has 2 cores: the suite's own ``-n 2`` plus burners is the "machine busy with other
work" case), and reports every failing test id with the run it failed in. Logs of
failing runs are kept under ``--logs``.

    python bench/stress.py --runs 200 tests/frontend/test_broker.py
    python bench/stress.py --runs 20 --parallel 2 --burners 2 tests/frontend tests/reliability

Nothing here is timed: the figure is failures per run. The burners end with this
process however it ends; on SIGTERM or Ctrl-C the pytest runs under way finish first.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def _burn(parent: int) -> None:
    """A busy loop, until its parent is gone (however it ended)."""
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


def _run(selection: list[str], log: Path, workers: int, extra: str) -> tuple[int, list[str]]:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-x", *extra.split()]
    if workers > 1:
        args += ["-n", str(workers)]
    with log.open("wb") as out:
        rc = subprocess.run([*args, *selection], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text(errors="replace")
    return rc.returncode, FAILED.findall(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("selection", nargs="+", help="pytest paths or node ids")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=2, help="pytest runs at a time")
    ap.add_argument("--workers", type=int, default=1, help="xdist workers per run (-n)")
    ap.add_argument("--burners", type=int, default=1, help="busy-loop processes alongside")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/ktd-stress"))
    ap.add_argument("--pytest", default="", help="more pytest options, e.g. '--log-level=DEBUG'")
    a = ap.parse_args(argv)
    a.logs.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below runs
    me = os.getpid()
    burners = [
        multiprocessing.Process(target=_burn, args=(me,), daemon=True) for _ in range(a.burners)
    ]
    for b in burners:
        b.start()
    failures: collections.Counter[str] = collections.Counter()
    bad_runs: list[int] = []
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    try:
        with ThreadPoolExecutor(a.parallel) as pool:
            jobs = {
                pool.submit(_run, a.selection, a.logs / f"run-{i:04d}.log", a.workers, a.pytest): i
                for i in range(a.runs)
            }
            for job, i in jobs.items():
                rc, failed = job.result()
                if rc != 0:
                    bad_runs.append(i)
                    failures.update(failed or [f"<exit {rc}, no test named>"])
                    print(f"run {i}: exit {rc}: {', '.join(failed) or '?'}", flush=True)
                else:
                    (a.logs / f"run-{i:04d}.log").unlink(missing_ok=True)
    finally:
        for b in burners:
            b.kill()
    took = time.monotonic() - started
    print(
        f"{a.runs} runs of {' '.join(a.selection)} in {took:.0f} s, {a.parallel} at a time,"
        f" {a.burners} burners (load average {load0:.2f} at start,"
        f" {os.getloadavg()[0]:.2f} at end): {len(bad_runs)} failed"
    )
    for test, n in failures.most_common():
        print(f"  {n:4d}  {test}")
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
