"""Streaming proxy cost: direct vs nginx vs the ktd frontend vs LiteLLM, in one run.

Starts ``ktd serve`` + ``ktd frontend`` on a throw-away config whose one model
is the simulated engine at full speed (``KTD_SIM_TOKEN_RATE=0``), loads it,
then puts the same SSE load on four targets, alternating them each round:

* ``direct``  - the sim's own port;
* ``nginx``   - nginx in front of the sim (config generated here: one upstream
  with HTTP/1.1 keep-alive, ``proxy_buffering off``), when nginx is installed;
* ``ktd``     - the ktd frontend (on its standing claim: no daemon round trip per request);
* ``litellm`` - LiteLLM's proxy with the sim as an OpenAI-compatible endpoint,
  when ``--litellm`` names a working ``litellm`` executable (a separate venv:
  ``python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install
  'litellm[proxy]'``); skipped with the reason printed otherwise.

Two measurements per target:

* throughput: ``wrk`` (C, one thread, so the load generator costs little of
  the 2-core budget), ``--concurrency`` connections each streaming
  ``--tokens``-token completions back to back for ``--seconds``; a Lua hook
  counts the SSE events of every response. CPU of the proxy processes is read
  from /proc/<pid>/stat (utime+stime) before and after: nginx = master and
  workers, ktd = frontend + daemon, litellm = its process tree.
* time to first byte: sequential requests (concurrency 1) from this process
  (trio, raw sockets, keep-alive); TTFB = request sent -> first body bytes.
  "added" = the target's percentile minus direct's.

Two optional targets make the comparisons of issue 22 in the same run:

* ``bare``    - the floor: ``hypercorn -k trio bench.bare_asgi:app``, an ASGI app
  that answers the same stream by itself (no proxying), under the same
  Hypercorn trio worker as the frontend (``--no-bare`` to skip);
* ``floor``   - the least a proxy inside Hypercorn can do: ``bare_asgi:proxy``
  relays the stream on ktd's own upstream client under ktd's Hypercorn patches,
  with none of ktd's request work (no key, routing, admission, metrics);
* ``rawfloor`` - ``bare_asgi:raw_proxy``: the floor without ktd's upstream client
  (bare sockets, ktd's parser), for what that client costs;
* ``relay``   - the least a proxy on trio can do, with no HTTP server at all:
  ``bench/raw_relay.py`` passes the bytes on raw trio sockets;
* ``before``  - the frontend of another checkout (``--before DIR``: a worktree
  with its own ``.venv``), on the same daemon and engine, so old and new
  frontends are measured alternately in one run.

TTFB and CPU per request are measured round-robin: request i goes to target
i mod n, so load on the shared machine falls on all targets alike. With
``--pairwise``, TTFB is measured one target at a time, alternating with direct
alone: each proxy then serves every other request, as a proxy in use does, and
is not measured just after five others had the CPU (which adds to every proxy
here alike). CPU per
request: ``--req-requests`` sequential streams of ``--req-tokens`` tokens per
target per round; the frontend's own process (the daemon is off the request
path and shown apart).

Targets (issue 22): added TTFB p50 <= 0.5 ms and p99 <= 2 ms over direct; CPU
per chunk <= 2x nginx; CPU per request <= 1.5x the bare Hypercorn app;
throughput >= 0.95 of direct (and >= 10x better than LiteLLM per chunk).

    python bench/proxy_stream.py [--concurrency 64] [--tokens 64] [--seconds 8]
                                 [--rounds 2] [--ttfb-requests 300] [--litellm PATH]
                                 [--before /tmp/ktd-before] [--no-bare] [--pairwise]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Stack,
    chat_body,
    cpu_seconds,
    descendants,
    free_port,
    pct,
    sim_model,
    time_limit,
    wait_for,
)

from ktd.frontend.upstream import UpstreamPool

ALIAS = "bench"
# The engine's key (issue 32: an engine answers only with its key). Given as the
# engine's own --api-key so the direct, nginx and LiteLLM targets can send it; the ktd
# frontend carries it by itself (what a client sends the frontend is dropped).
ENGINE_KEY = "bench-engine-key"
DEFAULT_LITELLM = "/tmp/litellm-venv/bin/litellm"

WRK_LUA = """
wrk.method = "POST"
wrk.body = %(body)s
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "text/event-stream"
wrk.headers["Authorization"] = "Bearer %(key)s"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) events = 0; bad = 0; short = 0 end
function response(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
  local _, n = string.gsub(body, "data: ", "")
  events = events + n
  if not string.find(body, "data: [DONE]", 1, true) then short = short + 1 end
end
function done(summary, latency, requests)
  local ev, b, s = 0, 0, 0
  for _, t in ipairs(threads) do
    ev = ev + t:get("events"); b = b + t:get("bad"); s = s + t:get("short")
  end
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests": %%d, "duration_us": %%d, "events": %%d, "bad_status": %%d, ' ..
    '"no_done": %%d, "errors": %%d, "lat_p50_us": %%d, "lat_p99_us": %%d}\\n',
    summary.requests, summary.duration, ev, b, s,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Target:
    name: str
    url: str
    pids: list[int]  # whose CPU is this target's cost (empty for direct)
    tree: bool = False  # and their descendants (not for ktd: the engines are the daemon's)
    requests: int = 0
    events: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    errors: int = 0
    ttfb: list[float] = field(default_factory=list)
    ttfb_errors: int = 0
    sent_at: list[float] = field(default_factory=list)  # each TTFB's request, perf_counter
    req_pids: list[int] = field(default_factory=list)  # whose CPU is the per-request cost
    req_cpu: float = 0.0
    req_n: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cps(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_k(self) -> float:
        return self.cpu / self.events * 1000 if self.events else float("nan")

    @property
    def cpu_per_req_ms(self) -> float:
        return self.req_cpu / self.req_n * 1e3 if self.req_n else float("nan")


# ---------------------------------------------------------------- proxies


def start_nginx(root: Path, upstream_port: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    conf = root / "nginx.conf"
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / d).mkdir(exist_ok=True)
    conf.write_text(
        f"""
daemon off;
worker_processes auto;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream engine {{
        server 127.0.0.1:{upstream_port};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""
    )
    log = open(root / "nginx.out", "wb")  # noqa: SIM115
    proc = subprocess.Popen(["nginx", "-p", str(root), "-c", str(conf)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _tcp_open(port), 10, "nginx")
    return proc, url


def start_litellm(
    root: Path, exe: str, engine_url: str
) -> tuple[subprocess.Popen[bytes] | None, str, str]:
    """(process, url, reason-if-skipped)."""
    if not Path(exe).exists():
        return None, "", f"{exe} not found (see the module docstring to install it)"
    port = free_port()
    cfg = root / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {ALIAS}\n"
        "    litellm_params:\n"
        f"      model: openai/{ALIAS}\n"
        f"      api_base: {engine_url}/v1\n"
        f"      api_key: {ENGINE_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_TELEMETRY="False",
        DISABLE_SCHEMA_UPDATE="True",
        # No master key: a local benchmark, nothing to protect (LiteLLM refuses otherwise).
        LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
    )
    log = open(root / "litellm.out", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (root / "litellm.out").read_text(errors="replace")[-800:]
            return None, "", f"litellm exited {proc.returncode}: {tail}"
        if _tcp_open(port):
            return proc, url, ""
        time.sleep(0.3)
    stop(proc)
    return None, "", "litellm did not start listening within 90 s"


def _tcp_open(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (its whole group when it leads one), then SIGKILL after 15 s."""
    if proc is None or proc.poll() is not None or _signal(proc, signal.SIGTERM):
        return
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def _signal(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """True when the process is already gone."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        return True
    return False


# ---------------------------------------------------------------- load


def run_wrk(t: Target, root: Path, args: argparse.Namespace) -> None:
    script = root / "stream.lua"
    body = chat_body(ALIAS, args.tokens).decode()
    script.write_text(WRK_LUA % {"body": json.dumps(body), "key": ENGINE_KEY})
    pids = [q for p in t.pids for q in descendants(p)] if t.tree else list(t.pids)
    c0 = cpu_seconds(pids)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{args.concurrency}",
            f"-d{args.seconds}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            t.url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        timeout=args.seconds + 60,
    )
    t.cpu += cpu_seconds(pids) - c0
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK ")), None)
    if line is None:
        raise SystemExit(f"bench: wrk failed on {t.name}:\n{out.stdout}\n{out.stderr}")
    res = json.loads(line[4:])
    t.requests += res["requests"]
    t.events += res["events"]
    t.seconds += res["duration_us"] / 1e6
    t.errors += res["errors"] + res["bad_status"] + res["no_done"]


async def _one_stream(pool: UpstreamPool, url: str, body: bytes) -> tuple[float, float] | None:
    """One stream on ``pool``'s keep-alive connection: when it was sent and its TTFB
    (``time.perf_counter``, the same clock in every process), or None if it failed."""
    headers = [
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"authorization", f"Bearer {ENGINE_KEY}".encode()),
    ]
    t0 = time.perf_counter()
    try:
        resp = await pool.request(url, b"/v1/chat/completions", headers, body)
        try:
            first = 0.0
            tail = b""
            while not resp.done:
                data = await resp.receive()
                if data and not first:
                    first = time.perf_counter() - t0
                tail = (tail + data)[-32:]
            ok = resp.status == 200 and b"[DONE]" in tail
        finally:
            resp.close()
    except Exception:
        ok = False
    return (t0, first) if ok else None


async def round_robin(
    targets: list[Target], n: int, tokens: int, *, record: bool = True, cpu: bool = False
) -> None:
    """``n`` sequential streams per target, request i to target i mod len(targets).

    ``record``: keep the TTFBs; ``cpu``: add each target's ``req_pids`` CPU over
    the sequence to its per-request cost.
    """
    pools = [UpstreamPool(read_timeout=30) for _ in targets]
    body = chat_body(ALIAS, tokens)
    pids = [
        [q for p in t.req_pids for q in descendants(p)] if t.tree else t.req_pids for t in targets
    ]
    c0 = [cpu_seconds(p) for p in pids] if cpu else []
    try:
        for _ in range(n):
            for t, pool in zip(targets, pools, strict=True):
                got = await _one_stream(pool, t.url, body)
                if not record:
                    continue
                if got is None:
                    t.ttfb_errors += 1
                else:
                    t.sent_at.append(got[0])
                    t.ttfb.append(got[1])
    finally:
        for pool in pools:
            await pool.aclose()
    if cpu:
        for t, p, before in zip(targets, pids, c0, strict=True):
            t.req_cpu += cpu_seconds(p) - before
            t.req_n += n


def start_listening(
    argv: Callable[[str], list[str]],
    what: str,
    *,
    env: dict[str, str],
    log: IO[bytes],
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A server on a free loopback port (``argv`` gets its ``host:port``), once it listens."""
    port = free_port()
    proc = subprocess.Popen(
        argv(f"127.0.0.1:{port}"),
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )
    wait_for(lambda: _tcp_open(port), 30, what)
    return proc, f"http://127.0.0.1:{port}"


def start_bare(root: Path, app: str, upstream: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """``hypercorn -k trio bare_asgi:<app>``: the floors (bench/bare_asgi.py)."""
    env = dict(os.environ)
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join((str(here), str(here.parent)))
    env["BARE_UPSTREAM"] = upstream
    log = open(root / f"{app.replace(':', '-')}.out", "wb")  # noqa: SIM115
    return start_listening(
        lambda bind: [sys.executable, "-m", "hypercorn", "-k", "trio", "-b", bind, app],
        f"hypercorn {app}",
        env=env,
        log=log,
    )


def start_relay(
    root: Path, upstream: str, stamps: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``bench/raw_relay.py``: the floor of a relay on trio, without Hypercorn."""
    script = str(Path(__file__).resolve().parent / "raw_relay.py")
    log = open(root / "raw_relay.out", "wb")  # noqa: SIM115
    hostport = upstream.split("//", 1)[1]
    extra = ["--stamps", str(stamps)] if stamps else []
    return start_listening(
        lambda bind: [sys.executable, script, bind, hostport, *extra],
        "the raw trio relay",
        env=dict(os.environ),
        log=log,
    )


def checkout_python(checkout: Path) -> Path:
    """Another checkout's own venv (``--before``)."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"bench: {python} not found (make the checkout's venv first)")
    return python


def start_before(stack: Stack, checkout: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The frontend of another checkout (its own venv), on the same daemon."""
    python = checkout_python(checkout)
    env = dict(stack.env)
    env["PYTHONPATH"] = str(checkout)
    config = str(stack.root / "config.json")
    log = open(stack.root / "before.out", "wb")  # noqa: SIM115
    return start_listening(
        lambda bind: [str(python), "-m", "ktd", "frontend", "--config", config, "--bind", bind],
        "the --before frontend",
        env=env,
        log=log,
        cwd=checkout,
    )


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens = chunks per stream")
    ap.add_argument("--seconds", type=int, default=8, help="wrk duration per target per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttfb-requests", type=int, default=300, help="per target per round")
    ap.add_argument(
        "--req-requests", type=int, default=300, help="CPU/request: per target per round"
    )
    ap.add_argument("--req-tokens", type=int, default=4, help="CPU/request: tokens per stream")
    ap.add_argument("--litellm", default=DEFAULT_LITELLM, help="litellm executable ('' = skip)")
    ap.add_argument("--before", type=Path, help="another checkout whose frontend to compare")
    ap.add_argument(
        "--pairwise",
        action="store_true",
        help="TTFB: each target alternates with direct alone (not round-robin over all)",
    )
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument(
        "--no-bare", action="store_true", help="skip the floors (bare, floor, rawfloor, relay)"
    )
    ap.add_argument("--limit", type=float, default=1500, help="hard limit on the whole run (s)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench: wrk is needed (apt-get install -y wrk)")

    root = Path(tempfile.mkdtemp(prefix="ktdb-proxy-", dir="/tmp"))
    stack: Stack | None = None
    extra: list[subprocess.Popen[bytes] | None] = []
    skipped: dict[str, str] = {}
    try:
        with time_limit(args.limit):
            model = sim_model(ALIAS, KTD_SIM_TOKEN_RATE=0)
            model["kt"]["extra_args"] = ["--api-key", ENGINE_KEY]
            stack = Stack([model])
            engine = stack.load(ALIAS)
            targets = [Target("direct", engine, [])]
            if args.no_nginx:
                skipped["nginx"] = "--no-nginx"
            elif shutil.which("nginx") is None:
                skipped["nginx"] = "nginx not installed (apt-get install -y nginx-light)"
            else:
                nginx, url = start_nginx(root, int(engine.rsplit(":", 1)[1]))
                extra.append(nginx)
                targets.append(Target("nginx", url, [nginx.pid], tree=True))
            if args.no_bare:
                skipped["bare"] = "--no-bare"
            else:
                bare, url = start_bare(root, "bare_asgi:app")
                extra.append(bare)
                targets.append(Target("bare", url, [bare.pid], tree=True, req_pids=[bare.pid]))
                floor, url = start_bare(root, "bare_asgi:proxy", engine)
                extra.append(floor)
                targets.append(Target("floor", url, [floor.pid], tree=True, req_pids=[floor.pid]))
                raw, url = start_bare(root, "bare_asgi:raw_proxy", engine)
                extra.append(raw)
                targets.append(Target("rawfloor", url, [raw.pid], tree=True, req_pids=[raw.pid]))
                relay, url = start_relay(root, engine)
                extra.append(relay)
                targets.append(Target("relay", url, [relay.pid], req_pids=[relay.pid]))
            assert stack.frontend is not None
            targets.append(
                Target("ktd", stack.url, stack.proxy_pids(), req_pids=[stack.frontend.pid])
            )
            if args.before:
                before, url = start_before(stack, args.before)
                extra.append(before)
                assert stack.daemon is not None
                targets.append(
                    Target("before", url, [before.pid, stack.daemon.pid], req_pids=[before.pid])
                )
            if args.litellm:
                litellm, url, why = start_litellm(root, args.litellm, engine)
                if litellm is None:
                    skipped["litellm"] = why
                else:
                    extra.append(litellm)
                    targets.append(Target("litellm", url, [litellm.pid], tree=True))
            else:
                skipped["litellm"] = "--litellm ''"
            print(
                f"bench: {args.concurrency} concurrent streams x {args.tokens} tokens, "
                f"{args.seconds}s per target, {args.rounds} round(s); "
                f"TTFB over {args.ttfb_requests} sequential streams per round; CPU/request "
                f"over {args.req_requests} x {args.req_tokens}-token streams per round\n"
                f"  direct {engine}  " + "  ".join(f"{t.name} {t.url}" for t in targets[1:]),
                flush=True,
            )
            for name, why in skipped.items():
                print(f"  {name}: skipped: {why}", flush=True)
            # warm-up: connections, caches, LiteLLM's first-request imports
            trio.run(functools.partial(round_robin, targets, 20, 8, record=False))
            for i in range(args.rounds):
                # Alternate the order (direct stays first): neither side always runs
                # right after the same neighbour.
                order = [targets[0], *(targets[1:] if i % 2 == 0 else targets[:0:-1])]
                for t in order:
                    run_wrk(t, root, args)
                if args.pairwise:
                    for t in order[1:]:
                        trio.run(round_robin, [order[0], t], args.ttfb_requests, args.tokens)
                else:
                    trio.run(round_robin, order, args.ttfb_requests, args.tokens)
                trio.run(
                    functools.partial(
                        round_robin,
                        order,
                        args.req_requests,
                        args.req_tokens,
                        record=False,
                        cpu=True,
                    )
                )
                print(
                    f"  round {i + 1}: "
                    + "  ".join(f"{t.name} {t.rps:.0f} req/s" for t in targets),
                    flush=True,
                )
    finally:
        for proc in reversed(extra):
            stop(proc)
        if stack is not None:
            stack.close()
        shutil.rmtree(root, ignore_errors=True)

    report(targets, skipped)
    return 0


def report(targets: list[Target], skipped: dict[str, str]) -> None:
    direct = targets[0]
    d50, d99 = pct(direct.ttfb, 0.5), pct(direct.ttfb, 0.99)
    print()
    print(
        f"{'target':<9}{'req/s':>9}{'chunks/s':>10}{'x direct':>9}"
        f"{'ttfb p50':>10}{'added':>9}{'ttfb p99':>10}{'added':>9}"
        f"{'CPU s/1k chunks':>17}{'CPU ms/req':>12}{'errors':>8}"
    )
    for t in targets:
        t50, t99 = pct(t.ttfb, 0.5), pct(t.ttfb, 0.99)
        cpu = "-" if not t.pids else f"{t.cpu_per_k:.4f}"
        req = "-" if not t.req_n else f"{t.cpu_per_req_ms:.3f}"
        print(
            f"{t.name:<9}{t.rps:>9.1f}{t.cps:>10.0f}{t.cps / direct.cps:>9.2f}"
            f"{t50 * 1e3:>8.2f}ms{(t50 - d50) * 1e3:>+7.2f}ms"
            f"{t99 * 1e3:>8.2f}ms{(t99 - d99) * 1e3:>+7.2f}ms"
            f"{cpu:>17}{req:>12}{t.errors + t.ttfb_errors:>8}"
        )
    by = {t.name: t for t in targets}
    print()
    for name in ("ktd", "before"):
        if name in by:
            for what, ok, figure in checks(by[name], by):
                verdict = "skipped" if ok is None else ("MET" if ok else "MISSED")
                print(f"  {name:<7}{verdict:<8} {what}: {figure}")


def checks(ktd: Target, by: dict[str, Target]) -> list[tuple[str, bool | None, str]]:
    """Issue 22's targets for one frontend (earlier: 3x then 2x nginx, +1 then +0.3 ms)."""
    direct = by["direct"]
    out: list[tuple[str, bool | None, str]] = []
    added = (pct(ktd.ttfb, 0.5) - pct(direct.ttfb, 0.5)) * 1e3
    out.append(("added TTFB p50 <= 0.5 ms", added <= 0.5, f"{added:+.2f} ms"))
    added99 = (pct(ktd.ttfb, 0.99) - pct(direct.ttfb, 0.99)) * 1e3
    out.append(("added TTFB p99 <= 2 ms", added99 <= 2, f"{added99:+.2f} ms"))
    if "nginx" in by:
        r = ktd.cpu_per_k / by["nginx"].cpu_per_k
        out.append(("CPU/chunk <= 2x nginx", r <= 2, f"{r:.2f}x nginx"))
    else:
        out.append(("CPU/chunk <= 2x nginx", None, "nginx skipped"))
    if "bare" in by:
        r = ktd.cpu_per_req_ms / by["bare"].cpu_per_req_ms
        out.append(("CPU/request <= 1.5x bare Hypercorn", r <= 1.5, f"{r:.2f}x bare"))
    else:
        out.append(("CPU/request <= 1.5x bare Hypercorn", None, "bare skipped"))
    ratio = ktd.cps / direct.cps
    out.append(("throughput >= 0.95 of direct", ratio >= 0.95, f"{ratio:.2f}"))
    if "litellm" in by:
        r = by["litellm"].cpu_per_k / ktd.cpu_per_k
        out.append(("CPU/chunk >= 10x better than LiteLLM", r >= 10, f"{r:.1f}x better"))
    return out


if __name__ == "__main__":
    sys.exit(main())
