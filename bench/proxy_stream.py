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

Targets (issue #6): ktd CPU/chunk within 3x nginx and >= 10x better than
LiteLLM; ktd throughput >= 0.8 of direct; added TTFB p50 < 1 ms.

    python bench/proxy_stream.py [--concurrency 64] [--tokens 64] [--seconds 8]
                                 [--rounds 2] [--ttfb-requests 300] [--litellm PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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
DEFAULT_LITELLM = "/tmp/litellm-venv/bin/litellm"

WRK_LUA = """
wrk.method = "POST"
wrk.body = %(body)s
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "text/event-stream"
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

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cps(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_k(self) -> float:
        return self.cpu / self.events * 1000 if self.events else float("nan")


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
        "      api_key: none\n"
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
    script.write_text(WRK_LUA % {"body": json.dumps(body)})
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


async def ttfb_run(t: Target, n: int, tokens: int) -> None:
    """``n`` sequential streams on one keep-alive connection; TTFB of each."""
    pool = UpstreamPool(read_timeout=30)
    body = chat_body(ALIAS, tokens)
    headers = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                resp = await pool.request(t.url, b"/v1/chat/completions", headers, body)
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
            if ok:
                t.ttfb.append(first)
            else:
                t.ttfb_errors += 1
    finally:
        await pool.aclose()


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens = chunks per stream")
    ap.add_argument("--seconds", type=int, default=8, help="wrk duration per target per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttfb-requests", type=int, default=300, help="per target per round")
    ap.add_argument("--litellm", default=DEFAULT_LITELLM, help="litellm executable ('' = skip)")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--limit", type=float, default=900, help="hard limit on the whole run (s)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench: wrk is needed (apt-get install -y wrk)")

    root = Path(tempfile.mkdtemp(prefix="ktdb-proxy-", dir="/tmp"))
    stack: Stack | None = None
    nginx: subprocess.Popen[bytes] | None = None
    litellm: subprocess.Popen[bytes] | None = None
    skipped: dict[str, str] = {}
    try:
        with time_limit(args.limit):
            stack = Stack([sim_model(ALIAS, KTD_SIM_TOKEN_RATE=0)])
            engine = stack.load(ALIAS)
            targets = [Target("direct", engine, [])]
            if args.no_nginx:
                skipped["nginx"] = "--no-nginx"
            elif shutil.which("nginx") is None:
                skipped["nginx"] = "nginx not installed (apt-get install -y nginx-light)"
            else:
                nginx, url = start_nginx(root, int(engine.rsplit(":", 1)[1]))
                targets.append(Target("nginx", url, [nginx.pid], tree=True))
            targets.append(Target("ktd", stack.url, stack.proxy_pids()))
            if args.litellm:
                litellm, url, why = start_litellm(root, args.litellm, engine)
                if litellm is None:
                    skipped["litellm"] = why
                else:
                    targets.append(Target("litellm", url, [litellm.pid], tree=True))
            else:
                skipped["litellm"] = "--litellm ''"
            print(
                f"bench: {args.concurrency} concurrent streams x {args.tokens} tokens, "
                f"{args.seconds}s per target, {args.rounds} round(s); "
                f"TTFB over {args.ttfb_requests} sequential streams per round\n"
                f"  direct {engine}  " + "  ".join(f"{t.name} {t.url}" for t in targets[1:]),
                flush=True,
            )
            for name, why in skipped.items():
                print(f"  {name}: skipped: {why}", flush=True)
            # warm-up: connections, caches, LiteLLM's first-request imports
            for t in targets:
                trio.run(ttfb_run, Target(t.name, t.url, []), 20, 8)
            for _ in range(args.rounds):
                for t in targets:
                    run_wrk(t, root, args)
                    trio.run(ttfb_run, t, args.ttfb_requests, args.tokens)
                    print(f"  {t.name}: {t.rps:.0f} req/s so far", flush=True)
    finally:
        stop(litellm)
        stop(nginx)
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
        f"{'CPU s/1k chunks':>17}{'errors':>8}"
    )
    for t in targets:
        t50, t99 = pct(t.ttfb, 0.5), pct(t.ttfb, 0.99)
        cpu = "-" if not t.pids else f"{t.cpu_per_k:.4f}"
        print(
            f"{t.name:<9}{t.rps:>9.1f}{t.cps:>10.0f}{t.cps / direct.cps:>9.2f}"
            f"{t50 * 1e3:>8.2f}ms{(t50 - d50) * 1e3:>+7.2f}ms"
            f"{t99 * 1e3:>8.2f}ms{(t99 - d99) * 1e3:>+7.2f}ms"
            f"{cpu:>17}{t.errors + t.ttfb_errors:>8}"
        )
    by = {t.name: t for t in targets}
    ktd = by["ktd"]
    print()
    # Issue 15's targets (the earlier ones were 3x nginx, 0.8 of direct, +1 ms p50).
    checks: list[tuple[str, bool | None, str]] = []
    if "nginx" in by:
        r = ktd.cpu_per_k / by["nginx"].cpu_per_k
        checks.append(("ktd CPU/chunk within 2x nginx", r <= 2, f"{r:.2f}x nginx"))
    else:
        checks.append(("ktd CPU/chunk within 2x nginx", None, "nginx skipped"))
    if "litellm" in by:
        r = by["litellm"].cpu_per_k / ktd.cpu_per_k
        checks.append(("ktd CPU/chunk >= 10x better than LiteLLM", r >= 10, f"{r:.1f}x better"))
    else:
        checks.append(("ktd CPU/chunk >= 10x better than LiteLLM", None, "litellm skipped"))
    ratio = ktd.cps / direct.cps
    checks.append(("ktd throughput >= 0.95 of direct", ratio >= 0.95, f"{ratio:.2f}"))
    added = (pct(ktd.ttfb, 0.5) - d50) * 1e3
    checks.append(("ktd added TTFB p50 < 0.3 ms", added < 0.3, f"{added:+.2f} ms"))
    added99 = (pct(ktd.ttfb, 0.99) - d99) * 1e3
    checks.append(("ktd added TTFB p99 < 1 ms", added99 < 1, f"{added99:+.2f} ms"))
    for what, ok, figure in checks:
        verdict = "skipped" if ok is None else ("MET" if ok else "MISSED")
        print(f"  {verdict:<8} {what}: {figure}")


if __name__ == "__main__":
    sys.exit(main())
