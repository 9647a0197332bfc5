"""Where the suite's time goes: wall and CPU seconds per test, written as JSON lines.

    python -m pytest -q -n 3 -p tests.timing --timing-out=/tmp/timing.jsonl
    python tests/timing.py /tmp/timing.jsonl            # the table of tests/README.md

Write the option with ``=``: pytest takes every argument that names an existing path for
one of the paths to test when it looks for its rootdir, so ``--timing-out FILE`` with a
FILE left by an earlier run made ``/tmp`` the rootdir, and the run lost
``pyproject.toml``'s options (its ``-m 'not slow and not real'`` among them).

Wall time alone says little on 2 shared cores: a test that sleeps through a timeout
and a test that burns the CPU look alike, and with ``-n 2`` each one's wall time
includes its neighbour's load. CPU seconds are robust to that: they are counted by
the kernel per process. A test's CPU here is what pytest's worker spent on it plus what
its children spent, counted when they are reaped (a daemon reaps its engines, the
test reaps the daemon): a process a module-scoped fixture starts is counted for the
module's last test, which is right for the module's total. "Idle" is wall minus CPU:
time the test waits (a sleep, a timeout, a poll) rather than works; that is where a
shorter configured timeout or a wait on the event instead of a fixed sleep pays.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timing-out",
        default=None,
        help="append one JSON line per test (wall and CPU seconds) to this file "
        "(write --timing-out=FILE: see this module's docstring)",
    )


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = item.config.getoption("--timing-out")
    if not out:
        yield
        return
    t0, c0 = time.monotonic(), _cpu()
    yield
    row = {
        "id": item.nodeid,
        "wall": round(time.monotonic() - t0, 3),
        "cpu": round(_cpu() - c0, 3),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with open(out, "a") as f:  # one short line per write: workers' lines do not interleave
        f.write(json.dumps(row) + "\n")


def table(rows: list[dict[str, Any]], top: int = 0) -> str:
    """Per module: tests, wall s, CPU s, idle share, and its slowest test."""
    mods: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "wall": 0.0, "cpu": 0.0, "worst": ("", 0.0)}
    )
    for r in rows:
        path, _, name = r["id"].partition("::")
        m = mods[path]
        m["n"] += 1
        m["wall"] += r["wall"]
        m["cpu"] += r["cpu"]
        if r["wall"] > m["worst"][1]:
            m["worst"] = (name, r["wall"])
    order = sorted(mods.items(), key=lambda kv: -kv[1]["wall"])
    if top:
        order = order[:top]
    lines = [
        "| module | tests | wall s | CPU s | idle | slowest test (s) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for path, m in order:
        idle = max(0.0, 1 - m["cpu"] / m["wall"]) if m["wall"] else 0.0
        name, worst = m["worst"]
        lines.append(
            f"| {path} | {m['n']} | {m['wall']:.1f} | {m['cpu']:.1f} | {idle:.0%} "
            f"| {name[:60]} ({worst:.1f}) |"
        )
    wall = sum(m["wall"] for m in mods.values())
    cpu = sum(m["cpu"] for m in mods.values())
    n = sum(m["n"] for m in mods.values())
    lines.append(f"| all {len(mods)} modules | {n} | {wall:.1f} | {cpu:.1f} | | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    top = int(argv[1]) if len(argv) > 1 else 0
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line]
    print(table(rows, top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
