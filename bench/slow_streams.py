"""Many slow streams: 1,000 concurrent streams at ~2 chunks/s, direct and through ktd.

Starts ``ktd serve`` + ``ktd frontend`` with one sim model paced at
``--rate`` tokens/s (``KTD_SIM_TOKEN_RATE``), loads it, then runs the same load
twice in one run: straight at the sim, then through the frontend. Each phase
opens ``--streams`` streams over ``--ramp`` seconds (one connection each) and
holds them until their ``--tokens`` tokens are in; every SSE event's arrival
time is recorded.

"steady" rows keep only the gaps that began after the last stream was opened
(all of them open, no connection set-up competing with the chunk relay).

Reported per phase: errors (status != 200, no ``[DONE]``, broken connection),
the gaps between consecutive paced events (gaps under half the pacing interval
are the unpaced role/finish/usage events and are left out), their delay
beyond the sim's pacing, and for the frontend phase its peak RSS and CPU.
"Added inter-chunk delay" = frontend's gap percentile minus direct's.

Targets (issue #6): no errors; added inter-chunk delay p99 < 5 ms; frontend
RSS < 200 MB.

    python bench/slow_streams.py [--streams 1000] [--rate 2] [--tokens 24] [--ramp 5]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Stack,
    chat_body,
    cpu_seconds,
    pct,
    raise_fd_limit,
    rss_bytes,
    sim_model,
    time_limit,
)

from ktd.frontend.upstream import UpstreamPool

ALIAS = "slow"  # each phase gets its own fresh sim: "slow-direct", "slow-ktd"


@dataclass
class Phase:
    name: str
    streams: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)  # gaps ending after the last stream opened
    ramp_end: float = 0.0
    events: int = 0
    peak_concurrent: int = 0
    rss_peak: int = 0
    cpu: float = 0.0
    seconds: float = 0.0


async def one_stream(
    pool: UpstreamPool, url: str, body: bytes, phase: Phase, live: list[int]
) -> None:
    headers = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
    times: list[float] = []
    live[0] += 1
    phase.peak_concurrent = max(phase.peak_concurrent, live[0])
    try:
        resp = await pool.request(url, b"/v1/chat/completions", headers, body)
        try:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            tail = b""
            while not resp.done:
                data = await resp.receive()
                if data:
                    now = time.monotonic()
                    times.extend([now] * data.count(b"data: "))
                    tail = (tail + data)[-32:]
            if b"data: [DONE]" not in tail:
                raise RuntimeError("no [DONE]")
        finally:
            resp.close()
    except Exception as exc:
        phase.errors += 1
        kind = type(exc).__name__ + (f": {exc}" if isinstance(exc, RuntimeError) else "")
        phase.error_kinds[kind] = phase.error_kinds.get(kind, 0) + 1
        return
    finally:
        live[0] -= 1
    phase.streams += 1
    phase.events += len(times)
    for a, b in itertools.pairwise(times):
        phase.gaps.append(b - a)
        if a >= phase.ramp_end:
            phase.steady.append(b - a)


async def run_phase(
    phase: Phase, url: str, args: argparse.Namespace, watch_pid: int | None, model: str
) -> None:
    pool = UpstreamPool(read_timeout=60, connect_timeout=30)
    body = chat_body(model, args.tokens)
    live = [0]
    t0 = time.monotonic()
    phase.ramp_end = t0 + args.ramp
    c0 = cpu_seconds([watch_pid]) if watch_pid else 0.0
    async with trio.open_nursery() as nursery:
        if watch_pid:

            async def sample_rss() -> None:
                while True:
                    phase.rss_peak = max(phase.rss_peak, rss_bytes(watch_pid))
                    await trio.sleep(0.2)

            nursery.start_soon(sample_rss)
        async with trio.open_nursery() as streams:
            for i in range(args.streams):
                streams.start_soon(one_stream, pool, url, body, phase, live)
                if args.ramp:
                    await trio.sleep_until(t0 + args.ramp * (i + 1) / args.streams)
        nursery.cancel_scope.cancel()
    if watch_pid:
        phase.rss_peak = max(phase.rss_peak, rss_bytes(watch_pid))
        phase.cpu = cpu_seconds([watch_pid]) - c0
    phase.seconds = time.monotonic() - t0
    await pool.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=2.0, help="sim tokens/s per stream")
    ap.add_argument("--tokens", type=int, default=24, help="max_tokens per stream")
    ap.add_argument("--ramp", type=float, default=5.0, help="seconds over which streams open")
    ap.add_argument("--limit", type=float, default=300, help="hard limit on the whole run (s)")
    args = ap.parse_args()
    # client sockets here, client + upstream sockets in the frontend, server ones in the sim
    fds = raise_fd_limit(4 * args.streams + 1024)
    if fds < 2 * args.streams + 256:
        raise SystemExit(f"bench: file descriptor limit {fds} is too low for {args.streams}")

    models = [sim_model(f"{ALIAS}-{p}", KTD_SIM_TOKEN_RATE=args.rate) for p in ("direct", "ktd")]
    with time_limit(args.limit), Stack(models) as stack:
        # A fresh sim per phase: a Python sim that has just served 1,000 streams has a
        # bigger heap (longer GC pauses) than a new one, which would bias the second phase.
        engine = stack.load(f"{ALIAS}-direct")
        stack.load(f"{ALIAS}-ktd")
        assert stack.frontend is not None
        fe_pid = stack.frontend.pid
        rss_idle = rss_bytes(fe_pid)
        print(
            f"bench: {args.streams} streams x {args.tokens} tokens at {args.rate:g} tokens/s, "
            f"opened over {args.ramp:g}s; fd limit {fds}\n"
            f"  direct {engine}  ktd {stack.url} (to a second sim)",
            flush=True,
        )
        # warm-up: a few requests so imports and pools are hot on both paths
        warm = argparse.Namespace(streams=4, tokens=2, ramp=0)
        trio.run(run_phase, Phase("warmup"), engine, warm, None, f"{ALIAS}-direct")
        trio.run(run_phase, Phase("warmup"), stack.url, warm, None, f"{ALIAS}-ktd")
        direct, front = Phase("direct"), Phase("ktd")
        trio.run(run_phase, direct, engine, args, None, f"{ALIAS}-direct")
        trio.run(run_phase, front, stack.url, args, fe_pid, f"{ALIAS}-ktd")
        time.sleep(0.5)
        rss_after = rss_bytes(fe_pid)
        in_flight = stack.engine(f"{ALIAS}-ktd").in_flight

    interval = 1.0 / args.rate
    print()
    print(
        f"{'phase':<8}{'streams':>9}{'errors':>8}{'peak conc':>11}{'gaps':>8}"
        f"{'gap p50':>10}{'gap p99':>10}{'late p50':>10}{'late p99':>10}{'late max':>10}"
    )
    for ph in (direct, front):
        paced = [g for g in ph.gaps if g >= interval / 2]
        late = [g - interval for g in paced]
        print(
            f"{ph.name:<8}{ph.streams:>9}{ph.errors:>8}{ph.peak_concurrent:>11}{len(paced):>8}"
            f"{pct(paced, 0.5) * 1e3:>8.1f}ms{pct(paced, 0.99) * 1e3:>8.1f}ms"
            f"{pct(late, 0.5) * 1e3:>8.2f}ms{pct(late, 0.99) * 1e3:>8.2f}ms"
            f"{max(late, default=float('nan')) * 1e3:>8.2f}ms"
        )
        steady = [g - interval for g in ph.steady if g >= interval / 2]
        print(
            f"{'  steady':<8}{'':>9}{'':>8}{'':>11}{len(steady):>8}{'':>10}{'':>10}"
            f"{pct(steady, 0.5) * 1e3:>8.2f}ms{pct(steady, 0.99) * 1e3:>8.2f}ms"
            f"{max(steady, default=float('nan')) * 1e3:>8.2f}ms"
        )
        for kind, n in ph.error_kinds.items():
            print(f"    {n} x {kind}")
    d_paced = [g for g in direct.gaps if g >= interval / 2]
    f_paced = [g for g in front.gaps if g >= interval / 2]
    added99 = (pct(f_paced, 0.99) - pct(d_paced, 0.99)) * 1e3
    added50 = (pct(f_paced, 0.5) - pct(d_paced, 0.5)) * 1e3
    mb = front.rss_peak / 2**20
    print()
    print(
        f"frontend: RSS idle {rss_idle / 2**20:.1f} MB, peak {mb:.1f} MB, "
        f"after {rss_after / 2**20:.1f} MB; CPU {front.cpu:.2f} s over {front.seconds:.1f} s"
        f" = {front.cpu / max(front.events, 1) * 1e6:.0f} us/event; in flight after {in_flight}"
    )
    d_st = [g for g in direct.steady if g >= interval / 2]
    f_st = [g for g in front.steady if g >= interval / 2]
    st99 = (pct(f_st, 0.99) - pct(d_st, 0.99)) * 1e3
    print(f"added inter-chunk delay: p50 {added50:+.2f} ms, p99 {added99:+.2f} ms")
    print(f"  (steady state, all {args.streams} streams open: p99 {st99:+.2f} ms)")
    checks = [
        ("no errors", front.errors == 0 and direct.errors == 0, f"{front.errors} errors"),
        ("added inter-chunk delay p99 < 5 ms", added99 < 5, f"{added99:+.2f} ms"),
        ("frontend RSS < 200 MB", mb < 200, f"peak {mb:.1f} MB"),
    ]
    for what, ok, figure in checks:
        print(f"  {'MET' if ok else 'MISSED':<8} {what}: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
