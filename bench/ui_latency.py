"""The dashboard: how soon a change shows in a browser, and what an open page costs.

Starts ``ktd serve`` + ``ktd frontend`` with one sim model and opens ``/ui`` in
headless chromium (Debian's, through its chromedriver: ``tests/ui_install.sh``).
A MutationObserver in the page records the wall-clock instant each time the
model's card changes state. Then ``--rounds`` times: ``load`` and ``evict``
through ktctl, with a subscription to the daemon's ``engine.<alias>`` events,
whose ``time`` is the daemon's wall clock at the change. Latency = the page's
instant for a state minus the daemon's for the same state (one machine, one
clock). Target (issue 23): under a second.

Then the idle cost: the frontend's CPU seconds over ``--idle`` seconds with the
page open (SUB socket, status refresh every 2 s, pings) and with no page (the
sampler alone, every 10 s).

    python bench/ui_latency.py [--rounds 10] [--idle 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, cpu_seconds, pct, sim_model, time_limit, wait_for

from ktctl import Subscription
from tests.frontend.ui.chrome import start_chrome

ALIAS = "ui-lat"
RECORDER = """
window.__seen = [];
let last = null;
const look = () => {
  const c = document.querySelector(`.card[data-alias='${arguments[0]}']`);
  const s = c ? c.dataset.state : null;
  if (s && s !== last) { last = s; window.__seen.push([s, Date.now() / 1000]); }
};
new MutationObserver(look).observe(document.getElementById('cards'),
  {subtree: true, childList: true, attributes: true});
look();
"""


def _event_time(sub: Subscription, state: str) -> float | None:
    """The daemon's wall-clock time of its (last) change to ``state`` among queued events."""
    found = None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        ev = sub.get(0.2)
        if ev is None:
            if found is not None:
                return found
            continue
        if ev.state == state:
            found = ev.time
    return found


def _page_time(driver: Any, state: str, since: float) -> float | None:
    """When the page first showed ``state`` after ``since`` (waiting up to 10 s for it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen = driver.execute_script("return window.__seen")
        for s, t in seen:
            if s == state and t >= since:
                return float(t)
        time.sleep(0.05)
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--idle", type=float, default=30.0)
    args = ap.parse_args()
    stack = Stack([sim_model(ALIAS)])
    driver = None
    try:
        driver = start_chrome(Path(tempfile.mkdtemp(prefix="ktdb-chrome-")))
        driver.get(stack.url + "/ui")
        wait_for(
            lambda: (
                driver.execute_script("return document.getElementById('conn-text').innerText")
                == "live"
            ),
            30,
            "the live page",
        )
        driver.execute_script(RECORDER, ALIAS)
        lat: dict[str, list[float]] = {"ready": [], "stopped": []}
        missed = 0
        with stack.client(timeout=60) as c:
            sub = c.subscribe([f"engine.{ALIAS}"], exact=True)
            for _ in range(args.rounds):
                for state, act in (("ready", c.load), ("stopped", c.evict)):
                    begun = time.time()
                    act(ALIAS)
                    at = _event_time(sub, state)
                    shown = _page_time(driver, state, begun)
                    if at is None or shown is None:
                        missed += 1
                    else:
                        lat[state].append(shown - at)
            sub.close()
        every = [x for v in lat.values() for x in v]
        print(f"rounds: {args.rounds} (load to ready, evict to stopped); not seen: {missed}")
        for name, values in [*lat.items(), ("all", every)]:
            ms = [1000 * v for v in values]
            top = max(ms) if ms else float("nan")
            p50, p95 = pct(ms, 0.5), pct(ms, 0.95)
            print(
                f"  {name:9s} n={len(ms):3d}  p50 {p50:6.1f} ms  p95 {p95:6.1f} ms"
                f"  max {top:6.1f} ms"
            )

        assert stack.frontend is not None
        fe = [stack.frontend.pid]
        before = cpu_seconds(fe)
        time.sleep(args.idle)
        open_cost = cpu_seconds(fe) - before
        driver.quit()
        driver = None
        time.sleep(15)  # past the hub's linger: the SUB socket and refreshers stop
        before = cpu_seconds(fe)
        time.sleep(args.idle)
        closed_cost = cpu_seconds(fe) - before
        print(
            f"frontend CPU over {args.idle:g}s idle: page open {open_cost:.3f}s, "
            f"no page {closed_cost:.3f}s"
        )
    finally:
        if driver is not None:
            driver.quit()
        stack.close()


if __name__ == "__main__":
    with time_limit(900):
        main()
