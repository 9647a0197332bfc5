"""Where a request's time goes inside the frontend: a clock on each phase.

Starts ``ktd serve`` with one full-speed sim model and the frontend under
``bench/_traced_frontend.py`` (the same frontend, with a stamp at the end of
each phase), sends ``--requests`` sequential streams through it (alternating
with the same number straight to the sim, for the client's own TTFB), then
prints, per phase, the p50/p90/p99 of the time since the previous phase and
since the request's bytes reached Hypercorn. ``--before DIR`` traces another
checkout's frontend (its own ``.venv``) the same way, in the same run.

The run also sends the same streams through ``bench/raw_relay.py`` (the least a
relay on trio adds, no HTTP server), and splits each proxy's added TTFB with the
client's own stamps (``time.perf_counter`` is one clock for every process):
how long the request took to reach the proxy, the proxy's time from its read of
the request to its write of the first body bytes (the engine's time included),
and how long those bytes took to reach the client. The first and last are outside
any proxy code: on a 2-vCPU box they are wake-ups and waits for a CPU.

    python bench/trace_request.py [--requests 500] [--tokens 16] [--token-rate 0]
                                  [--before /tmp/ktd-before]
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
from proxy_stream import (
    ALIAS,
    Target,
    checkout_python,
    round_robin,
    start_listening,
    start_relay,
)

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


async def drive(urls: list[str], n: int, tokens: int) -> list[Target]:
    """``n`` sequential streams per URL, round-robin; each URL's TTFBs and send times."""
    targets = [Target(url, url, []) for url in urls]
    await round_robin(targets, n, tokens)
    return targets


def split(name: str, client: Target, proxy: list[tuple[float, float]]) -> None:
    """Where a proxy's TTFB went: ``proxy`` is its (read, first body written) per request."""
    if len(proxy) != len(client.ttfb):
        print(f"  {name}: {len(proxy)} proxy stamps for {len(client.ttfb)} streams: no split")
        return
    rows = list(zip(client.sent_at, client.ttfb, proxy, strict=True))
    to_proxy = [(read - sent) * 1e3 for sent, _, (read, _) in rows]
    inside = [(out - read) * 1e3 for _, _, (read, out) in rows]
    to_client = [(sent + ttfb - out) * 1e3 for sent, ttfb, (_, out) in rows]
    print(
        f"  {name:<8} TTFB p50 {pct(client.ttfb, 0.5) * 1e3:.3f} = to the proxy "
        f"{pct(to_proxy, 0.5):.3f} + in it (engine included) {pct(inside, 0.5):.3f} "
        f"+ back to the client {pct(to_client, 0.5):.3f} (p50 each)"
    )


def traced_first_bytes(path: Path, warmup: int) -> list[tuple[float, float]]:
    """The traced frontend's (read, first body bytes written) per request."""
    out = []
    for req in json.loads(path.read_text())[warmup:]:
        stamps = dict(req)
        if "read" in stamps and "out" in stamps:
            out.append((stamps["read"], stamps["out"]))
    return out


def relay_first_bytes(path: Path, warmup: int, client: Target) -> list[tuple[float, float]]:
    """The relay's (read, last write before the client had its first body byte) per request."""
    out = []
    reqs = json.loads(path.read_text())[warmup:]
    for mine, sent, ttfb in zip(reqs, client.sent_at, client.ttfb, strict=False):
        writes = [t for t in mine[3::2] if t <= sent + ttfb]
        out.append((mine[0], writes[-1] if writes else mine[-1]))
    return out


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
    ap.add_argument(
        "--token-rate",
        type=float,
        default=0,
        help="the sim's tokens/s (0: all at once; a real engine's next token is ms away)",
    )
    ap.add_argument("--before", type=Path)
    ap.add_argument("--py-spy", type=Path, help="profile the new frontend meanwhile (raw stacks)")
    ap.add_argument(
        "--cprofile", type=Path, help="run the new frontend under cProfile (stats file)"
    )
    args = ap.parse_args()
    procs: list[tuple[str, subprocess.Popen[bytes], str, Path]] = []
    model = sim_model(ALIAS, KTD_SIM_TOKEN_RATE=args.token_rate)
    with time_limit(900), Stack([model], frontend=False) as stack:
        engine = stack.load(ALIAS)
        relay_out = stack.root / "relay.json"
        relay, relay_url = start_relay(stack.root, engine, relay_out)
        try:
            proc, url, out = start_traced(stack, "new", None, args.cprofile)
            procs.append(("new", proc, url, out))
            if args.before:
                proc, url, out = start_traced(stack, "before", args.before)
                procs.append(("before", proc, url, out))
            urls = [engine, relay_url] + [u for _, _, u, _ in procs]
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
            clients = trio.run(drive, urls, args.requests, args.tokens)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
        finally:
            for proc in [relay, *(p for _, p, _, _ in procs)]:
                proc.terminate()
            for proc in [relay, *(p for _, p, _, _ in procs)]:
                proc.wait(30)
        names = ["direct", "relay"] + [n for n, _, _, _ in procs]
        d50 = pct(clients[0].ttfb, 0.5)
        print(
            "client TTFB (ms):  "
            + "  ".join(
                f"{n} p50 {pct(t.ttfb, 0.5) * 1e3:.3f} (+{(pct(t.ttfb, 0.5) - d50) * 1e3:.3f})"
                f" p99 {pct(t.ttfb, 0.99) * 1e3:.3f}"
                for n, t in zip(names, clients, strict=True)
            )
        )
        print("\nthe added TTFB, split with the client's stamps (ms):")
        print(f"  direct   TTFB p50 {d50 * 1e3:.3f}")
        split("relay", clients[1], relay_first_bytes(relay_out, 30, clients[1]))
        for (name, _, _, out), client in zip(procs, clients[2:], strict=True):
            split(name, client, traced_first_bytes(out, 30))
        for name, _, _, out in procs:
            summarise(name, out, 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
