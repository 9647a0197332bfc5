"""Where a request's time goes inside the frontend: a clock on each phase.

Starts ``ktd serve`` with one full-speed sim model and the frontend under
``bench/_traced_frontend.py`` (the same frontend, with a stamp at the end of
each phase), sends ``--requests`` sequential streams through it (alternating
with the same number straight to the sim, for the client's own TTFB), then
prints, per phase, the p50/p90/p99 of the time since the previous phase and
since the request's bytes reached Hypercorn. ``--before DIR`` traces another
checkout's frontend (its own ``.venv``) the same way, in the same run.

    python bench/trace_request.py [--requests 500] [--tokens 16] [--before /tmp/ktd-before]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, pct, sim_model, time_limit
from proxy_stream import ALIAS, Target, checkout_python, round_robin, start_listening

HERE = Path(__file__).resolve().parent
PHASES = ["read", "app", "body", "slot", "sent", "head", "start", "chunk", "out", "end", "idle"]


def start_traced(
    stack: Stack, name: str, checkout: Path | None, profile: Path | None = None
) -> tuple[subprocess.Popen[bytes], str, Path]:
    out = stack.root / f"trace-{name}.json"
    env = dict(stack.env)
    env["KTD_TRACE_OUT"] = str(out)
    if profile is not None:
        env["KTD_TRACE_PROFILE"] = str(profile)
    python = sys.executable
    if checkout is not None:
        env["KTD_TRACE_REPO"] = str(checkout)
        env["PYTHONPATH"] = str(checkout)
        python = str(checkout_python(checkout))
    script, config = str(HERE / "_traced_frontend.py"), str(stack.root / "config.json")
    proc, url = start_listening(
        lambda bind: [python, script, "--config", config, "--bind", bind],
        f"the traced frontend ({name})",
        env=env,
        log=stack.log,
    )
    return proc, url, out


async def drive(urls: list[str], n: int, tokens: int) -> list[list[float]]:
    """``n`` sequential streams per URL, round-robin; each URL's TTFBs."""
    targets = [Target(url, url, []) for url in urls]
    await round_robin(targets, n, tokens)
    return [t.ttfb for t in targets]


def summarise(name: str, path: Path, warmup: int) -> None:
    requests = json.loads(path.read_text())[warmup:]
    print(f"\n{name}: {len(requests)} traced requests (ms; 'step' = since the phase before)")
    print(
        f"  {'phase':<8}{'n':>6}{'step p50':>10}{'p90':>8}{'p99':>8}"
        f"{'since read p50':>16}{'p99':>8}"
    )
    prev_name = None
    for phase in PHASES:
        steps: list[float] = []
        since: list[float] = []
        for req in requests:
            stamps = dict(req)
            if phase not in stamps or "read" not in stamps:
                continue
            since.append((stamps[phase] - stamps["read"]) * 1e3)
            if prev_name is not None and prev_name in stamps:
                steps.append((stamps[phase] - stamps[prev_name]) * 1e3)
        if not since:
            continue
        print(
            f"  {phase:<8}{len(since):>6}"
            + (
                f"{pct(steps, 0.5):>10.3f}{pct(steps, 0.9):>8.3f}{pct(steps, 0.99):>8.3f}"
                if steps
                else f"{'':>26}"
            )
            + f"{pct(since, 0.5):>16.3f}{pct(since, 0.99):>8.3f}"
        )
        prev_name = phase


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--before", type=Path)
    ap.add_argument("--py-spy", type=Path, help="profile the new frontend meanwhile (raw stacks)")
    ap.add_argument(
        "--cprofile", type=Path, help="run the new frontend under cProfile (stats file)"
    )
    args = ap.parse_args()
    procs: list[tuple[str, subprocess.Popen[bytes], str, Path]] = []
    with time_limit(600), Stack([sim_model(ALIAS, KTD_SIM_TOKEN_RATE=0)], frontend=False) as stack:
        engine = stack.load(ALIAS)
        try:
            proc, url, out = start_traced(stack, "new", None, args.cprofile)
            procs.append(("new", proc, url, out))
            if args.before:
                proc, url, out = start_traced(stack, "before", args.before)
                procs.append(("before", proc, url, out))
            urls = [engine] + [u for _, _, u, _ in procs]
            trio.run(drive, urls, 30, args.tokens)  # warm-up
            spy = None
            if args.py_spy:
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "--nonblocking",
                        "-r",
                        "1000",
                        "-f",
                        "raw",
                        "-o",
                        str(args.py_spy),
                        "--pid",
                        str(procs[0][1].pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            ttfb = trio.run(drive, urls, args.requests, args.tokens)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
        finally:
            for _, proc, _, _ in procs:
                proc.terminate()
            for _, proc, _, _ in procs:
                proc.wait(30)
        names = ["direct"] + [n for n, _, _, _ in procs]
        d50 = pct(ttfb[0], 0.5)
        print(
            "client TTFB (ms):  "
            + "  ".join(
                f"{n} p50 {pct(t, 0.5) * 1e3:.3f} (+{(pct(t, 0.5) - d50) * 1e3:.3f})"
                f" p99 {pct(t, 0.99) * 1e3:.3f}"
                for n, t in zip(names, ttfb, strict=True)
            )
        )
        for name, _, _, out in procs:
            summarise(name, out, 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
