"""Sleep and wake (issue 28): a swap by wake against a swap by reload, side by side.

Two sim models, ``a`` and ``b``, both on NUMA node 0 (``"numa": [0]``; this box has
one node), so they cannot both be awake. Each part runs twice in one run: once with
``"sleep": true`` on both entries (a swap puts the holder to sleep and wakes the
other) and once without (a swap stops the holder and loads the other cold). Every
request goes through ``ktd frontend`` (``/v1/chat/completions``, streaming, a few
tokens), timed on this script's clock.

1. **Swap latency.** Sim load ``--load-time`` (30 s), resume ``--resume-time`` (1 s),
   release ``--release-time`` (0.05 s). Sleep mode: ``b`` is loaded, then ``a`` (so
   ``b`` is asleep); reload mode: ``a`` only (``b`` stopped). Then one request at a
   time for the model that is not awake (``b``, ``a``, ``b``...): the time to its
   first ``data:`` event is the swap as a client sees it (the first byte is the
   frontend's ``: waking`` / ``: loading`` comment once ``stream_grace``, 0.5 s, is
   over; it is shown too). ktd's own overhead on a wake = that time - (resume +
   release of the other engine + the sim's token time: the
   readiness check's ``/health`` generates one token, and so does the request with
   ``KTD_SIM_TOKEN_RATE``); target < 50 ms. It is split on the daemon's event stamps
   (before the release, between it and ``ready``, ``ready`` to the data). A warm
   request (model awake) is timed too: the frontend's proxy cost, which the overhead
   includes.
2. **Mixed traffic.** Sim load ``--mixed-load-time`` (3 s), same resume/release,
   open-loop arrivals at ``--rate`` requests/s (Poisson, ``--seed``) for ``--duration``
   seconds (60), each for ``a`` or ``b`` at random 50/50; the same schedule in both
   modes. Before the traffic both models have been loaded once in sleep mode (one is
   asleep: its steady state) and ``a`` in reload mode. Reported: requests, errors,
   cold loads (the engines' ``loads`` counters from status), wakes (``engine.<alias>``
   events ``waking`` -> ``ready``, checked against the "awake" lines of ``ktctl logs``),
   seconds loading (the ``load_seconds_total`` counters) and waking (the events),
   latency p50/p95 from the request's send to its last byte.

Everything runs against 127.0.0.1; the script stops the daemon, the frontend and
(through them) the engines on exit, Ctrl-C and its own ``--limit``, then checks that
no engine process it saw is left (and kills any that is).

    python bench/sleep.py                                   # full: ~7 minutes
    python bench/sleep.py --load-time 3 --duration 15 --reload-swaps 2 --wake-swaps 4
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, chat_body, descendants, pct, sim_model, time_limit

from ktctl import Client
from ktd.sim.knobs import Knobs

ALIASES = ("a", "b")
#: States of an engine that is neither serving nor idle (a swap in progress).
MOVING = frozenset({"starting", "waking", "sleeping", "draining", "stopping"})


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class Sim:
    load_time: float
    resume_time: float
    release_time: float
    token_rate: float
    warmup: float

    def env(self) -> dict[str, float]:
        return {
            "KTD_SIM_LOAD_TIME": self.load_time,
            "KTD_SIM_WARMUP": self.warmup,
            "KTD_SIM_RESUME_TIME": self.resume_time,
            "KTD_SIM_RELEASE_TIME": self.release_time,
            "KTD_SIM_TOKEN_RATE": self.token_rate,
        }

    def token_time(self) -> float:
        """What a wake costs in generated tokens: the readiness check's ``/health``
        (one token) and, when paced, the request's own first token."""
        health = Knobs(token_rate=self.token_rate).token_time()
        first = 1.0 / self.token_rate if self.token_rate > 0 else 0.0
        return health + first


def models(sleep: bool, sim: Sim) -> list[dict[str, Any]]:
    out = []
    for alias in ALIASES:
        entry = sim_model(alias, **sim.env())
        entry["numa"] = [0]  # both on node 0: only one of them can be awake
        if sleep:
            entry["sleep"] = True
        out.append(entry)
    return out


def mode_name(sleep: bool) -> str:
    return "sleep" if sleep else "reload"


# ---------------------------------------------------------------- the client


@dataclass
class Result:
    model: str
    sent: float  # wall clock (time.time(), comparable with the daemon's event times)
    first: float = math.nan  # seconds from send: first byte of the response
    first_data: float = math.nan  # seconds from send: first SSE ``data:`` event
    total: float = math.nan  # seconds from send: the last byte (connection closed)
    status: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def request(port: int, model: str, tokens: int, timeout: float) -> Result:
    """One streamed chat completion through the frontend (``connection: close``)."""
    body = chat_body(model, tokens)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n\r\n"
    ).encode()
    res = Result(model=model, sent=time.time())
    t0 = time.monotonic()
    buf = bytearray()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(head + body)
            while chunk := s.recv(65536):
                now = time.monotonic() - t0
                if not buf:
                    res.first = now
                buf += chunk
                head_end = buf.find(b"\r\n\r\n")
                if math.isnan(res.first_data) and head_end >= 0 and b"data:" in buf[head_end:]:
                    res.first_data = now
        res.total = time.monotonic() - t0
    except OSError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    line = bytes(buf[: buf.find(b"\r\n")])
    try:
        res.status = int(line.split()[1])
    except (IndexError, ValueError):
        res.error = f"no status line: {bytes(buf[:200])!r}"
        return res
    if res.status != 200:
        res.error = f"HTTP {res.status}: {bytes(buf[-300:])!r}"
    elif b"[DONE]" not in buf:
        res.error = f"stream without [DONE]: {bytes(buf[-300:])!r}"
    return res


# ---------------------------------------------------------------- events


class Events:
    """Collects the ``engine.<alias>`` events (state changes) on its own thread."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.seen: list[tuple[float, str, str]] = []  # (daemon time, alias, state)
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise SystemExit("bench: the event subscription did not start")
        if self._error is not None:
            raise SystemExit(f"bench: event subscription: {self._error}")

    def _run(self) -> None:
        try:
            client = Client(self.socket_path, timeout=5)
            sub = client.subscribe([f"engine.{a}" for a in ALIASES], exact=True)
        except BaseException as exc:  # reported by __init__
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                ev = sub.get(0.1)
                if ev is None or ev.state is None:
                    continue
                with self._lock:
                    if self._last.get(ev.alias) != ev.state:
                        self._last[ev.alias] = ev.state
                        self.seen.append((ev.time, ev.alias, ev.state))
        finally:
            sub.close()
            client.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, start: float, end: float = math.inf) -> list[tuple[float, str, str]]:
        with self._lock:
            return [e for e in self.seen if start <= e[0] <= end]

    def wait(self, alias: str, state: str, since: float, timeout: float) -> float:
        """The daemon's time of ``alias`` entering ``state`` at or after ``since``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, who, st in self.between(since):
                if who == alias and st == state:
                    return t
            time.sleep(0.02)
        raise SystemExit(f"bench: {alias} did not reach {state} within {timeout:g}s")


def wakes(events: Sequence[tuple[float, str, str]]) -> list[tuple[str, float, float]]:
    """(alias, waking at, ready at) for every waking -> ready in ``events``."""
    out: list[tuple[str, float, float]] = []
    waking: dict[str, float] = {}
    for t, alias, state in events:
        if state == "waking":
            waking[alias] = t
        elif alias in waking:
            if state == "ready":
                out.append((alias, waking[alias], t))
            del waking[alias]
    return out


def union_seconds(
    events: Sequence[tuple[float, str, str]], states: frozenset[str], start: float, end: float
) -> float:
    """Wall time in [start, end] while at least one engine was in one of ``states``."""
    state: dict[str, str] = {}
    busy_since: float | None = None
    total = 0.0
    for t, alias, st in sorted(events):
        t = min(max(t, start), end)
        state[alias] = st
        busy = any(s in states for s in state.values())
        if busy and busy_since is None:
            busy_since = t
        elif not busy and busy_since is not None:
            total += t - busy_since
            busy_since = None
    if busy_since is not None:
        total += end - busy_since
    return total


# ---------------------------------------------------------------- the stack


class Bench:
    """One ``Stack`` (daemon + frontend) and its event collector; remembers every engine
    process it saw so that none is left behind."""

    def __init__(self, sleep: bool, sim: Sim) -> None:
        self.sleep = sleep
        self.stack = Stack(models(sleep, sim), daemon={"memory_timeout": 60})
        self.engine_pids: set[int] = set()
        try:
            self.events = Events(self.stack.socket)
            self.client = self.stack.client(timeout=30)
        except BaseException:
            self.stack.close()
            raise

    def status(self) -> dict[str, Any]:
        engines = {e.alias: e for e in self.client.status()}
        for e in engines.values():
            if e.pid:
                self.engine_pids.update(descendants(e.pid))
        return engines

    def load(self, alias: str, timeout: float) -> None:
        info = self.client.load(alias, timeout=timeout)
        if info.state != "ready":
            raise SystemExit(f"bench: {alias} did not load: {info.state} {info.reason}")
        self.status()

    def awake_lines(self) -> int:
        return sum(
            sum("awake: GPU memory resumed" in line for line in self.client.logs(a, 5000))
            for a in ALIASES
        )

    def close(self) -> None:
        try:
            self.events.close()
            self.client.close()
        finally:
            self.stack.close()
            left = [p for p in sorted(self.engine_pids) if _is_sim(p)]
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if left:
                print(f"bench: WARNING: engine processes left after the stack closed: {left}")

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_sim(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
    return not zombie and (b"sglang" in cmd or b"ktd.sim" in cmd)


# ---------------------------------------------------------------- part 1: swaps


@dataclass
class Swap:
    target: str
    ttfb: float
    first_data: float
    other_down: float  # seconds from send: the other engine asleep / stopped
    ready: float  # seconds from send: the target's ``ready`` event
    error: str | None


@dataclass
class SwapRun:
    sleep: bool
    warm: list[float] = field(default_factory=list)
    swaps: list[Swap] = field(default_factory=list)


def swap_part(sleep: bool, sim: Sim, n: int, tokens: int, warm_n: int) -> SwapRun:
    run = SwapRun(sleep)
    load_timeout = sim.load_time * 3 + 60
    down = "asleep" if sleep else "stopped"
    with Bench(sleep, sim) as bench:
        if sleep:
            bench.load("b", load_timeout)
            bench.load("a", load_timeout)  # puts b to sleep
        else:
            bench.load("a", load_timeout)
        state = {a: e.state for a, e in bench.status().items()}
        want = {"a": "ready", "b": down}
        if state != want:
            raise SystemExit(f"bench: {mode_name(sleep)}: start state {state}, wanted {want}")
        for _ in range(warm_n):
            r = request(bench.stack.port, "a", tokens, 30)
            if not r.ok:
                raise SystemExit(f"bench: warm request failed: {r.error}")
            run.warm.append(r.first_data)
        target, other = "b", "a"
        for i in range(n):
            time.sleep(0.5)  # let the last swap's tail (events, logs) settle
            before = {a: e.state for a, e in bench.status().items()}
            if before != {other: "ready", target: down}:
                raise SystemExit(f"bench: swap {i + 1}: state {before} before the request")
            r = request(bench.stack.port, target, tokens, load_timeout)
            ready_at = bench.events.wait(target, "ready", r.sent, 30)
            down_at = bench.events.wait(other, down, r.sent, 30)
            bench.status()
            run.swaps.append(
                Swap(
                    target,
                    r.first,
                    r.first_data,
                    down_at - r.sent,
                    ready_at - r.sent,
                    r.error,
                )
            )
            s = run.swaps[-1]
            print(
                f"  {mode_name(sleep):<6} swap {i + 1}: -> {target}: TTFB {s.ttfb * 1e3:9.1f} ms"
                f"  ({other} {down} at +{s.other_down * 1e3:.1f} ms, {target} ready at "
                f"+{s.ready * 1e3:.1f} ms){'  ERROR ' + s.error if s.error else ''}",
                flush=True,
            )
            target, other = other, target
    return run


# ---------------------------------------------------------------- part 2: mixed traffic


@dataclass
class MixedRun:
    sleep: bool
    results: list[Result]
    cold_loads: int
    cold_seconds: float
    wakes: int
    wake_seconds: float  # summed over the wakes (two overlap when one waits for the other)
    waking: float  # wall time while at least one engine was waking
    awake_log_lines: int
    moving: float
    window: float
    timeline: list[tuple[float, str, str]]  # (seconds from the start, alias, state)


def schedule(duration: float, rate: float, seed: int) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = 0.0
    while len(out) < 100_000:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append((t, rng.choice(ALIASES)))
    return out


def mixed_part(
    sleep: bool, sim: Sim, plan: list[tuple[float, str]], tokens: int, req_timeout: float
) -> MixedRun:
    load_timeout = sim.load_time * 3 + 60
    with Bench(sleep, sim) as bench:
        if sleep:
            bench.load("b", load_timeout)
            bench.load("a", load_timeout)
        else:
            bench.load("a", load_timeout)
        time.sleep(0.5)
        before = bench.status()
        awake_before = bench.awake_lines()
        results: list[Result] = []
        lock = threading.Lock()

        def one(model: str) -> None:
            r = request(bench.stack.port, model, tokens, req_timeout)
            with lock:
                results.append(r)

        threads: list[threading.Thread] = []
        start = time.time()
        t0 = time.monotonic()
        for offset, model in plan:
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            th = threading.Thread(target=one, args=(model,), daemon=True)
            th.start()
            threads.append(th)
        deadline = time.monotonic() + req_timeout + 10
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        end = time.time()
        time.sleep(0.5)
        after = bench.status()
        events = bench.events.between(start, end)
        since_setup = bench.events.between(0, end)  # the states at ``start`` too
        ws = wakes(events)
        with lock:
            done = list(results)
        lost = len(plan) - len(done)
        for _ in range(lost):
            done.append(Result(model="?", sent=start, error="no answer in time"))
        return MixedRun(
            sleep=sleep,
            results=done,
            cold_loads=sum(after[a].loads - before[a].loads for a in ALIASES),
            cold_seconds=sum(
                after[a].load_seconds_total - before[a].load_seconds_total for a in ALIASES
            ),
            wakes=len(ws),
            wake_seconds=sum(r - w for _, w, r in ws),
            waking=union_seconds(since_setup, frozenset({"waking"}), start, end),
            awake_log_lines=bench.awake_lines() - awake_before,
            moving=union_seconds(since_setup, MOVING, start, end),
            window=end - start,
            timeline=[(t - start, a, st) for t, a, st in events],
        )


# ---------------------------------------------------------------- report


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "-"


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--load-time", type=float, default=30.0, help="part 1: sim load (s)")
    ap.add_argument("--resume-time", type=float, default=1.0, help="sim resume (s), both parts")
    ap.add_argument("--release-time", type=float, default=0.05, help="sim release (s)")
    ap.add_argument("--warmup", type=float, default=0.1, help="sim warm-up after load (s)")
    ap.add_argument("--token-rate", type=float, default=0.0, help="sim tokens/s (0: unpaced)")
    ap.add_argument("--tokens", type=int, default=4, help="max_tokens of every request")
    ap.add_argument("--reload-swaps", type=int, default=4, help="part 1: swaps by reload")
    ap.add_argument("--wake-swaps", type=int, default=10, help="part 1: swaps by wake")
    ap.add_argument("--warm", type=int, default=10, help="part 1: warm requests (no swap)")
    ap.add_argument("--mixed-load-time", type=float, default=3.0, help="part 2: sim load (s)")
    ap.add_argument("--duration", type=float, default=60.0, help="part 2: traffic (s)")
    ap.add_argument("--rate", type=float, default=1.0, help="part 2: requests/s (Poisson)")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--timeline", action="store_true", help="part 2: print the state events")
    ap.add_argument("--skip", choices=("swaps", "mixed"), help="leave one part out")
    ap.add_argument("--limit", type=float, default=1800, help="hard limit on the whole run (s)")
    args = ap.parse_args()

    swap_sim = Sim(
        args.load_time, args.resume_time, args.release_time, args.token_rate, args.warmup
    )
    mixed_sim = Sim(
        args.mixed_load_time, args.resume_time, args.release_time, args.token_rate, args.warmup
    )
    print(f"bench: load average at start {load_average()} ({os.cpu_count()} CPUs)", flush=True)
    runs: dict[bool, SwapRun] = {}
    mixed: dict[bool, MixedRun] = {}
    loads: list[str] = [load_average()]
    with time_limit(args.limit):
        if args.skip != "swaps":
            print(
                f"\n1. swaps: load {args.load_time:g} s, resume {args.resume_time:g} s, "
                f"release {args.release_time:g} s",
                flush=True,
            )
            runs[True] = swap_part(True, swap_sim, args.wake_swaps, args.tokens, args.warm)
            loads.append(load_average())
            runs[False] = swap_part(False, swap_sim, args.reload_swaps, args.tokens, args.warm)
            loads.append(load_average())
        if args.skip != "mixed":
            plan = schedule(args.duration, args.rate, args.seed)
            n_a = sum(m == "a" for _, m in plan)
            print(
                f"\n2. mixed traffic: {len(plan)} requests ({n_a} a, {len(plan) - n_a} b) over "
                f"{args.duration:g} s, load {args.mixed_load_time:g} s",
                flush=True,
            )
            req_timeout = args.duration + 20 * args.mixed_load_time + 60
            for sleep in (True, False):
                mixed[sleep] = mixed_part(sleep, mixed_sim, plan, args.tokens, req_timeout)
                m = mixed[sleep]
                print(
                    f"  {mode_name(sleep)}: done in {m.window:.1f} s, cold loads {m.cold_loads}, "
                    f"wakes {m.wakes}",
                    flush=True,
                )
                loads.append(load_average())

    print(f"\nload average during the run (1/5/15 min): {' | '.join(loads)}")
    if runs:
        report_swaps(runs[True], runs[False], swap_sim)
    if mixed:
        report_mixed(mixed[True], mixed[False], args.timeline)
    return 0


def report_swaps(wake: SwapRun, reload: SwapRun, sim: Sim) -> None:
    floor = sim.resume_time + sim.release_time + sim.token_time()
    print(
        f"\n1. swap: the first request after it, from its send (client clock)\n"
        f"   engine floor of a wake: resume {sim.resume_time:g} + release {sim.release_time:g}"
        f" + token time {sim.token_time():g} = {floor * 1e3:.1f} ms"
    )
    print(
        f"\n{'':<8}{'swaps':>6}{'errors':>8}{'first byte':>12}"
        f"{'first data':>13}{'min':>12}{'max':>12}   (medians, min and max of the data)"
    )
    for run in (wake, reload):
        xs = [s.ttfb for s in run.swaps if s.error is None]
        fd = [s.first_data for s in run.swaps if s.error is None]
        errors = sum(s.error is not None for s in run.swaps)
        if not xs:
            print(f"{mode_name(run.sleep):<8}{len(run.swaps):>6}{errors:>8}   (no answers)")
            continue
        print(
            f"{mode_name(run.sleep):<8}{len(run.swaps):>6}{errors:>8}"
            f"{ms(statistics.median(xs)):>12}{ms(statistics.median(fd)):>13}"
            f"{ms(min(fd)):>12}{ms(max(fd)):>12}"
        )
    # The first byte of a stream that waits is a ``: waking``/``: loading`` comment (the
    # frontend commits to 200 after stream_grace): the swap as a client sees it ends at
    # the first data event.
    w = [s.first_data for s in wake.swaps if s.error is None]
    r = [s.first_data for s in reload.swaps if s.error is None]
    if w and r:
        print(
            "\nreload / wake, time to the first data event (medians): "
            f"{ratio(statistics.median(r), statistics.median(w))}"
        )
    warm = statistics.median(wake.warm + reload.warm) if wake.warm + reload.warm else math.nan
    over = [x - floor for x in w]
    print(f"\nktd overhead per wake (first data event - {floor * 1e3:.1f} ms):")
    print("  " + ", ".join(f"{x * 1e3:.1f}" for x in over) + " ms")
    if over:
        med = statistics.median(over)
        verdict = "MET" if med < 0.05 else "MISSED"
        print(f"  median {ms(med)}, max {ms(max(over))}")
        print(f"  {verdict:<8} ktd overhead on a wake < 50 ms: {ms(med)}")
        print(
            f"  (a warm request's first data event, no swap: median {ms(warm)}; "
            f"the wake beyond it: {ms(med - warm)})"
        )
    # Where ktd's time goes, on the daemon's event stamps (same clock as ours):
    # before: send -> holder asleep, less the release; between: holder asleep ->
    # target ready, less resume and the readiness check's token; after: target ready ->
    # the client's first data event (the frontend hears of ready and proxies).
    token = Knobs(token_rate=sim.token_rate).token_time()
    parts = [
        (
            s.other_down - sim.release_time,
            s.ready - s.other_down - sim.resume_time - token,
            s.first_data - s.ready,
        )
        for s in wake.swaps
        if s.error is None
    ]
    print(
        "\nper wake, ms from the send: holder asleep / target ready / first byte / first data;"
        "\n  ktd's share: before the release / between release and ready / ready -> data"
    )
    for s, (before, between, after) in zip(
        [s for s in wake.swaps if s.error is None], parts, strict=True
    ):
        at = (s.other_down, s.ready, s.ttfb, s.first_data)
        print(
            f"  -> {s.target}: "
            + " ".join(f"{x * 1e3:8.1f}" for x in at)
            + "   | "
            + " ".join(f"{x * 1e3:6.1f}" for x in (before, between, after))
        )
    if parts:
        meds = [statistics.median(p[i] for p in parts) * 1e3 for i in range(3)]
        print(
            f"  medians of ktd's share: {meds[0]:.1f} before the release, {meds[1]:.1f} "
            f"between release and ready, {meds[2]:.1f} from ready to the first data event"
        )


def report_mixed(sleep: MixedRun, reload: MixedRun, timeline: bool) -> None:
    print(
        "\n2. mixed traffic (latency: send to last byte; s loading: the cold loads' own time;"
        "\n   s waking: wall time while an engine was waking, summed over wakes in brackets;"
        "\n   s moving: wall time while any engine was starting, waking, sleeping or stopping)"
    )
    header = (
        f"{'':<8}{'requests':>9}{'errors':>7}{'cold loads':>11}{'wakes':>6}{'s loading':>10}"
        f"{'s waking':>16}{'s moving':>9}{'p50':>9}{'p95':>9}{'max':>9}"
    )
    print(header)
    rows: dict[bool, tuple[float, float, float]] = {}
    for m in (sleep, reload):
        lat = [r.total for r in m.results if r.ok]
        errors = sum(not r.ok for r in m.results)
        p50, p95 = pct(lat, 0.5), pct(lat, 0.95)
        rows[m.sleep] = (p50, p95, m.cold_seconds + m.waking)
        waking = f"{m.waking:.1f} ({m.wake_seconds:.1f})"
        print(
            f"{mode_name(m.sleep):<8}{len(m.results):>9}{errors:>7}{m.cold_loads:>11}"
            f"{m.wakes:>6}{m.cold_seconds:>10.1f}{waking:>16}{m.moving:>9.1f}"
            f"{p50:>8.2f}s{p95:>8.2f}s{max(lat, default=math.nan):>8.2f}s"
        )
        durations = [r - w for _, w, r in wakes([(t, a, st) for t, a, st in m.timeline])]
        if durations:
            print(
                f"  one wake (waking -> ready): median {ms(statistics.median(durations))}, "
                f"max {ms(max(durations))}"
            )
        if m.awake_log_lines != m.wakes:
            print(f"  note: {m.awake_log_lines} 'awake' log lines against {m.wakes} wake events")
        for r in m.results:
            if not r.ok:
                print(f"  error ({r.model}): {r.error}")
        if timeline:
            print("  timeline (s from the first request, engine, state):")
            for t, alias, st in m.timeline:
                print(f"    {t:8.3f} {alias} {st}")
    on, off = rows[True], rows[False]
    print(
        f"\nreload / sleep: seconds loading or waking {ratio(off[2], on[2])}, "
        f"p50 {ratio(off[0], on[0])}, p95 {ratio(off[1], on[1])}"
    )


if __name__ == "__main__":
    sys.exit(main())
