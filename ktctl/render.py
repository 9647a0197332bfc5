"""Human (and JSON) output of ktctl: pure functions from protocol data to text.

Kept apart from the CLI so every format is unit-testable without a daemon, a
terminal or a clock (``now``/``width`` are parameters, never read here).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from ktd import protocol as p
from ktd.core import states as S
from ktd.core.cpulist import format_cpulist

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

FAIL_STATUSES = frozenset({"fail", "failed", "error"})


# ---------------------------------------------------------------- small pieces


def one_line(text: str) -> str:
    """Text safe for a single terminal line: no ANSI codes, no control characters.

    Several lines are joined with spaces (a multi-line failure reason in a table).

    Engine logs are full of tqdm bars (``\\r``-rewritten) and colour codes; only
    what the terminal would finally show after the last ``\\r`` is kept.
    """
    parts = []
    for line in _ANSI.sub("", text).split("\n"):
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
        line = _CONTROL.sub("", line.replace("\t", " ")).strip()
        if line:
            parts.append(line)
    return " ".join(parts)


def truncate(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` characters, marking the cut with ``...``."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    return text[: width - 3] + "..."


def duration(seconds: float) -> str:
    """``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``: precise when short, brief when long."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ranges(values: Iterable[int]) -> str:
    """``[0,1,2,3,8]`` -> ``0-3,8``: CPU lists of big servers stay readable."""
    return format_cpulist(values) or "-"


def clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def address(engine: p.EngineInfo) -> str | None:
    """``host:port`` of an engine, from its URL when the daemon gave one."""
    if engine.url:
        rest = engine.url.split("://", 1)[-1]
        return rest.split("/", 1)[0] or None
    if engine.port:
        return f"127.0.0.1:{engine.port}"
    return None


#: Longest phase shown beside a state: some daemons report the last log line as
#: the phase, and a table cell must not grow to a whole SGLang log line.
PHASE_WIDTH = 40


def state_text(state: str | None, phase: str | None = None) -> str:
    state = state or "?"
    return f"{state} ({truncate(one_line(phase), PHASE_WIDTH)})" if phase else state


def engine_line(engine: p.EngineInfo, elapsed: float | None = None) -> str:
    """``deepseek-v4-kt ready on 127.0.0.1:30000 (pid 1234) in 12.3s`` and its variants.

    A load that stopped other engines says so (``; stopped a, b to make room``): on a
    pipe there is no progress line, and an evicted engine must not go unnoticed."""
    phase = engine.phase if engine.state != S.READY else None
    out = f"{engine.alias} {state_text(engine.state, phase)}"
    where = address(engine)
    if where and engine.state in (S.STARTING, S.READY, S.DRAINING):
        out += f" on {where}"
    if engine.pid:
        out += f" (pid {engine.pid})"
    if elapsed is not None:
        out += f" in {duration(elapsed)}"
    if engine.reason and engine.state != S.READY:
        out += f": {one_line(engine.reason)}"
    if engine.made_room:
        out += f"; stopped {', '.join(engine.made_room)} to make room"
    return out


def _url(engine: p.EngineInfo) -> str | None:
    if engine.url:
        return engine.url
    where = address(engine)
    return f"http://{where}" if where else None


def sleep_line(engine: p.EngineInfo, elapsed: float | None = None, *, already: bool = False) -> str:
    """``m is asleep (GPU memory released; experts kept in host RAM, 120.0 GiB), slept in 3.2s``.

    ``already``: the engine was asleep before this sleep was asked for (a no-op). A
    ``sleep_ttl`` is said too (``; stops after 30m00s asleep``)."""
    kept = "experts kept in host RAM"
    if engine.host_bytes:
        kept += f", {gib(engine.host_bytes)}"
    verb = "was already" if already else "is"
    out = f"{engine.alias} {verb} asleep (GPU memory released; {kept})"
    if elapsed is not None and not already:
        out += f", slept in {duration(elapsed)}"
    if engine.sleep_ttl:
        out += f"; stops after {duration(engine.sleep_ttl)} asleep"
    return out


def wake_line(engine: p.EngineInfo, elapsed: float | None = None, *, already: bool = False) -> str:
    """``m is ready on http://127.0.0.1:30000 (pid 1234), woke in 4.2s``.

    ``already``: the engine was ready before this wake was asked for (a no-op)."""
    out = f"{engine.alias} {'was already' if already else 'is'} ready"
    url = _url(engine)
    if url:
        out += f" on {url}"
    if engine.pid:
        out += f" (pid {engine.pid})"
    if already:
        return out
    if elapsed is not None:
        out += f", woke in {duration(elapsed)}"
    if engine.made_room:
        out += f"; made room: {', '.join(engine.made_room)} (put to sleep or stopped)"
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; the last column is not padded (no trailing blanks)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [c.ljust(widths[i]) for i, c in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------- commands


def eta_text(elapsed: float, eta: float | None) -> str:
    """``12.3s/~5m10s``: elapsed and, when ktd has seen this model load before, expected."""
    return duration(elapsed) + (f"/~{duration(eta)}" if eta else "")


def phase_cell(e: p.EngineInfo, now: float) -> str:
    """What the engine is doing, never a raw log line: phase (+ elapsed/expected load)."""
    if e.state == S.STARTING:
        text = e.phase or S.STARTING
        if e.load_started:
            text += " " + eta_text(now - e.load_started, e.load_eta)
        return truncate(one_line(text), PHASE_WIDTH)
    if e.state in (S.DRAINING, S.STOPPING, S.SLEEPING, S.WAKING) and e.phase:
        return truncate(one_line(e.phase), PHASE_WIDTH)
    if e.state == S.ASLEEP:
        # Its process lives on with its experts in host RAM: for how long, and how much.
        parts = [f"{duration(now - e.asleep_since)} asleep"] if e.asleep_since else []
        if e.host_bytes:
            parts.append(f"{gib(e.host_bytes)} host RAM")
        return truncate(", ".join(parts), PHASE_WIDTH) or "-"
    return "-"


def queued_cell(e: p.EngineInfo, now: float) -> str:
    """``3, 12s``: requests waiting for it, and how long the oldest has waited."""
    if not e.queued:
        return "-"
    if e.queued_since is None:
        return str(e.queued)
    return f"{e.queued}, {duration(max(0.0, now - e.queued_since))}"


def until_cell(e: p.EngineInfo, now: float) -> str:
    """When the idle TTL evicts it (``ollama ps``'s UNTIL); asleep: when ``sleep_ttl``
    stops it."""
    if e.state == S.ASLEEP:
        if not e.sleep_ttl or e.asleep_since is None:
            return "-"
        return f"in {duration(e.asleep_since + e.sleep_ttl - now)}"
    if e.state != S.READY or not e.ttl:
        return "-"
    if e.in_flight:
        return "busy"
    if e.expires_at is None:
        return "-"
    return f"in {duration(e.expires_at - now)}"


def status_table(engines: Sequence[p.EngineInfo], now: float) -> str:
    if not engines:
        return "no engines"
    rows = []
    for e in engines:
        state = e.state or "?"
        if e.stale:
            state += " [stale]"
        running = e.state in S.HAS_PROCESSES  # asleep too: its process lives on
        uptime = duration(now - e.started_at) if running and e.started_at else "-"
        gpus = ranges(e.gpus)
        if e.state == S.ASLEEP and e.gpus:
            gpus = f"({gpus})"  # its GPUs, released: a wake needs them back
        rows.append(
            [
                e.alias,
                state,
                phase_cell(e, now),
                str(e.pid) if e.pid else "-",
                str(e.port) if e.port else "-",
                ranges(e.numa_nodes),
                gpus,
                str(e.in_flight),
                uptime,
                f"{duration(now - e.last_used)} ago" if e.last_used else "-",
                until_cell(e, now),
                one_line(e.reason) if e.reason else "",
            ]
        )
    headers = [
        "ALIAS", "STATE", "PHASE", "PID", "PORT", "NUMA", "GPUS", "IN_FLIGHT", "UPTIME", "USED",
        "UNTIL", "REASON",
    ]  # fmt: skip
    if any(e.sleep in SLEEP_SHOWN for e in engines):  # only when a model may sleep
        headers.insert(-1, "SLEEP")
        for e, row in zip(engines, rows, strict=True):
            row.insert(-1, e.sleep if e.sleep in SLEEP_SHOWN else "-")
    if any(e.queued for e in engines):  # only while requests wait (issue 46)
        headers.insert(-1, "QUEUED")
        for e, row in zip(engines, rows, strict=True):
            row.insert(-1, queued_cell(e, now))
    if any(e.gateway for e in engines):  # only when ktd registers with a gateway
        headers.insert(-1, "GATEWAY")
        for e, row in zip(engines, rows, strict=True):
            row.insert(-1, gateway_cell(e.gateway))
    notes = [f"note: {e.alias}: {n}" for e in engines for n in e.notes]
    notes += [f"note: {e.alias}: {SLEEP_UNSUPPORTED}" for e in engines if e.sleep == "unsupported"]
    notes += [
        f"note: {e.alias}: --kt-num-gpu-experts {e.gpu_experts} (kept on this host after an "
        "out-of-memory load of the derived count)"
        for e in engines
        if e.gpu_experts is not None
    ]
    return "\n".join([table(headers, rows), *notes])


#: ``EngineInfo.sleep`` values shown in status's SLEEP column ("off" is not shown).
SLEEP_SHOWN = frozenset({"on", "unsupported"})
SLEEP_UNSUPPORTED = (
    'configured with "sleep": true, but its SGLang lacks --enable-memory-saver: '
    "it is stopped instead of put to sleep"
)


def gateway_cell(regs: Sequence[p.Registration]) -> str:
    """``registered``, or per router when they disagree (``registered,absent``)."""
    states = [r.state for r in regs]
    if not states:
        return "-"
    return states[0] if len(set(states)) == 1 else ",".join(states)


def gateway_text(info: p.GatewayInfo, now: float) -> str:
    """One line per router: reachable or not, what is registered there, the last error."""
    lines = [
        f"gateway ({info.mode} mode)" + (f": {info.frontend_url}" if info.frontend_url else "")
    ]
    for r in info.routers:
        if r.up is None:
            state = "not tried yet"
        elif r.up:
            state = f"up, {r.ours} of {r.workers} worker(s) ours"
        else:
            retry = f", retry in {duration(r.next_try - now)}" if r.next_try else ""
            state = f"DOWN ({r.failures} failure(s){retry})"
        line = f"  {r.url}: {state}"
        if r.error:
            line += f": {one_line(r.error)}"
        lines.append(line)
    return "\n".join(lines)


def models_table(models: Sequence[p.ModelInfo]) -> str:
    if not models:
        return "no models configured"
    rows = [
        [m.alias, m.backend, "yes" if m.served else "no", m.state if m.served else "-", m.path]
        for m in models
    ]
    return table(["ALIAS", "BACKEND", "SERVED", "STATE", "PATH"], rows)


USAGE_FIELDS = ("day", "key", "model", "requests", "prompt", "completion", "errors", "cut")


def usage_table(rows: Sequence[p.UsageCount]) -> str:
    """The ledger's rows and their total ("-": a frontend without keys)."""
    if not rows:
        return "no usage recorded"
    cells = [[r.day, r.key or "-", r.model, *_usage_numbers(r)] for r in rows]
    total = p.UsageCount(day="1970-01-01", model="")
    for r in rows:
        total.requests += r.requests
        total.prompt += r.prompt
        total.completion += r.completion
        total.errors += r.errors
        total.cut += r.cut
    cells.append(["total", "", "", *_usage_numbers(total)])
    # CUT: requests whose client went away before the end (charged what they received).
    headers = ["DAY", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "ERRORS", "CUT"]
    return table(headers, cells)


def _usage_numbers(r: p.UsageCount) -> list[str]:
    return [str(r.requests), str(r.prompt), str(r.completion), str(r.errors), str(r.cut)]


def usage_csv(rows: Sequence[p.UsageCount]) -> str:
    """The rows as CSV with a header line (no total: a spreadsheet sums)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(USAGE_FIELDS)
    for r in rows:
        writer.writerow([getattr(r, f) for f in USAGE_FIELDS])
    return out.getvalue().rstrip("\n")


def gib(n: Any) -> str:
    return f"{n / (1 << 30):.1f} GiB" if isinstance(n, (int, float)) else "unknown"


def verify_lines(snaps: Sequence[p.EngineMemoryReply], sleep_s: float, wake_s: float) -> list[str]:
    """``ktctl sleep --verify``: where the engine's memory was awake, asleep and awake
    again, and what the sleep freed and kept."""
    before, asleep, after = snaps
    out = [
        f"{before.alias}: slept in {sleep_s:.2f}s, woke in {wake_s:.2f}s "
        f"(pid {before.pid}, {before.processes} process(es))"
    ]
    if after.pid != before.pid:
        out.append(f"  WARNING: pid {before.pid} became {after.pid}: the wake loaded it afresh")
    out.append(f"  {'':24}{'awake':>12}{'asleep':>12}{'awake again':>14}")

    def row(name: str, values: Sequence[float | int | None]) -> None:
        cells = "".join(f"{size(v):>12}" for v in values[:2])
        out.append(f"  {name:24}{cells}{size(values[2]):>14}")

    if before.gpu is None:
        out.append(f"  GPU: not measured: {before.gpu_note or 'nvidia-smi did not say'}")
    else:
        gpus = sorted({u.gpu for s in snaps for u in s.gpu or []})
        for g in gpus:
            row(f"GPU {g} (nvidia-smi)", [_on(s.gpu, g) for s in snaps])
    nodes = sorted({u.node for s in snaps for u in s.host})
    for n in nodes:
        row(
            f"host, NUMA node {n}",
            [next((u.bytes for u in s.host if u.node == n), 0) for s in snaps],
        )
    figures = (("weights", "weight_gb"), ("KV cache", "kv_cache_gb"), ("CUDA graphs", "graph_gb"))
    for label, field in figures:
        values = [None if s.sglang is None else getattr(s.sglang, field) * (1 << 30) for s in snaps]
        row(f"SGLang: {label}", values)
    if before.gpu is not None and asleep.gpu is not None:
        had = sum(u.bytes for u in before.gpu)
        kept = sum(u.bytes for u in asleep.gpu)
        out.append(f"  the sleep freed {size(had - kept)} on the GPUs and kept {size(kept)}")
    held = asleep.host_held
    out.append(f"  host memory it holds asleep (ktd's estimate, the fits use it): {size(held)}")
    return out


def size(n: float | int | None) -> str:
    """Bytes as people read them: GiB, or MiB below one (a sim, the tiny test model)."""
    if n is None:
        return "-"
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _on(use: Sequence[p.GpuUse] | None, gpu: int) -> int:
    return sum(u.bytes for u in use or [] if u.gpu == gpu)


def doctor_failed(report: Mapping[str, Any]) -> bool:
    return any(str(c.get("status", "")).lower() in FAIL_STATUSES for c in _checks(report))


def _checks(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    checks = report.get("checks", [])
    return [c for c in checks if isinstance(c, Mapping)] if isinstance(checks, list) else []


def doctor_text(report: Mapping[str, Any]) -> str:
    """One line per check (``ok``/``warn``/``fail``), advice indented under non-ok ones."""
    checks = _checks(report)
    if not checks:
        return "doctor: no checks reported"
    out = []
    counts: dict[str, int] = {}
    for c in checks:
        status = str(c.get("status", "?")).lower()
        counts[status] = counts.get(status, 0) + 1
        line = f"{status:<5} {c.get('name', '?')}"
        if c.get("detail"):
            line += f": {c['detail']}"
        out.append(line)
        if c.get("advice") and status != "ok":
            out.append(f"      -> {c['advice']}")
    out.append("summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(out)


def event_lines(ev: p.Event) -> list[str]:
    """``time topic state reason`` for state changes; one line per log line for logs."""
    head = f"{clock(ev.time)} {ev.topic}"
    if ev.topic.startswith(("log.", "probe.")):
        return [f"{head} | {line.rstrip()}" for line in ev.lines] or [head]
    parts = [head]
    if ev.state:
        parts.append(state_text(ev.state, ev.phase))
    if ev.pid:
        parts.append(f"pid={ev.pid}")
    if ev.port:
        parts.append(f"port={ev.port}")
    if ev.in_flight is not None:
        parts.append(f"in_flight={ev.in_flight}")
    if ev.reason:
        parts.append(one_line(ev.reason))
    parts += [one_line(line) for line in ev.lines]
    return [" ".join(parts)]


def log_tail_text(alias: str, lines: Sequence[str]) -> str:
    return "\n".join([f"last {len(lines)} log lines of {alias}:", *(f"  {ln}" for ln in lines)])


# ---------------------------------------------------------------- JSON


def builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def reply_doc(reply: p.Reply) -> dict[str, Any]:
    """A reply as a JSON document: its fields, without the wire-only ``id`` and ``type``."""
    doc: dict[str, Any] = builtins(reply)
    doc.pop("id", None)
    kind = doc.pop("type", None)
    if kind == "ok":
        doc = {"ok": True, **doc}
    return doc


def error_doc(code: str, message: str, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "detail": builtins(dict(detail or {}))}}


def dumps(obj: Any, *, stream: bool = False) -> str:
    """One JSON document (indented) or one JSON line (``stream``), structs allowed."""
    data = builtins(obj)
    if stream:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(data, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------- load progress


class LoadProgress:
    """The one rewritten status line of ``ktctl load`` (and ``wake``, ``sleep``) on a terminal.

    Fed with the alias's ``engine.``/``log.`` events; ``line`` renders
    ``alias state (phase) 12.3s | last log line`` cut to the terminal width.
    """

    def __init__(self, alias: str, started: float, state: str = "loading") -> None:
        self.alias = alias
        self.started = started
        self.state = state  # until the first engine event: "loading", "waking", ...
        # A load's expected duration is no wake's or sleep's (unless it reloads after all).
        self.loading = state == "loading"
        self.phase: str | None = None
        self.last_line = ""
        self.eta: float | None = None

    def update(self, ev: p.Event) -> None:
        if ev.topic.startswith("engine."):
            if ev.state:
                if ev.state != self.state:
                    self.phase = None
                self.state = ev.state
            if ev.phase:
                self.phase = ev.phase
            if ev.load_eta:
                self.eta = ev.load_eta
        elif ev.topic.startswith("log."):
            for raw in reversed(ev.lines):
                line = one_line(raw)
                if line:
                    self.last_line = line
                    break

    def line(self, now: float, width: int) -> str:
        loading = self.state != S.READY and (self.loading or self.state == S.STARTING)
        elapsed = eta_text(now - self.started, self.eta if loading else None)
        text = f"{self.alias} {state_text(self.state, self.phase)} {elapsed}"
        if self.last_line and one_line(self.phase or "") != self.last_line:
            text += f" | {self.last_line}"
        # One column short of the width: writing the last column makes some
        # terminals wrap, and the next \r would then rewrite the wrong line.
        return truncate(text, max(width - 1, 10))
