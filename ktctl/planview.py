"""``ktctl load --dry-run`` and ``--estimate`` as text: the launch plan, the memory
estimate and the fit verdict (out of ``render``, which is long enough; issue 43).

The plan is the daemon's open JSON document (``ktd.daemon.doctor.dry_run_plan``). Every
key is said in words: a missing SGLang as the line that says a load would fail and what
to do, never ``sglang: null``; a key this ktctl does not know as ``key: value`` with no
``null`` or ``(None)`` in it. Pure functions, like ``render``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ktctl.render import gib, ranges

#: Plan keys shown by dedicated lines (or deliberately not at all: ``argv_flags``
#: repeats ``flags``, ``python`` is argv[0] and said with ``sglang``, ``impossible``
#: beside BLOCKED, ``error`` is the reason); any other key is said as ``key: value``.
_PLAN_KEYS = frozenset(
    {
        "alias", "ok", "argv", "argv_flags", "python", "env", "numa_nodes", "cpus", "cpulist",
        "gpus", "flags", "evict", "blocked_by", "reason", "notes", "state", "running_pid",
        "estimate", "fit", "sglang", "sglang_error", "impossible", "error", "sleeps",
    }
)  # fmt: skip


def argv_text(argv: Sequence[str], indent: str = "    ") -> str:
    """The command as a copy-pasteable shell line, one ``--flag value...`` per line."""
    import shlex

    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--") and groups[-1]:
            groups.append([])
        groups[-1].append(arg)
    lines = [shlex.join(g) for g in groups if g]
    return indent + (" \\\n" + indent + "  ").join(lines)


def _val(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, list | tuple):
        return " ".join(str(x) for x in v)
    return str(v)


def _flag_rows(flags: Any) -> list[tuple[str, str, str]]:
    """Normalise the plan's flags to ``(flag, value, origin)`` rows.

    ktd sends ``[{"name", "values", "origin"}]``; a dict of dicts, a dict of
    origins and ``flag``/``value`` spellings are accepted too, so a daemon that
    evolves the shape still gets a readable plan instead of a crash.
    """
    rows: list[tuple[str, str, str]] = []

    def row(name: Any, spec: Mapping[str, Any]) -> tuple[str, str, str]:
        value = spec.get("values", spec.get("value"))
        return (str(name), _val(value), _val(spec.get("origin", spec.get("source"))))

    if isinstance(flags, Mapping):
        for name, spec in flags.items():
            rows.append(
                row(name, spec) if isinstance(spec, Mapping) else (str(name), "", _val(spec))
            )
    elif isinstance(flags, list):
        for spec in flags:
            if isinstance(spec, Mapping):
                rows.append(row(spec.get("name", spec.get("flag", "?")), spec))
            elif isinstance(spec, list | tuple) and spec:
                rows.append(
                    (str(spec[0]), _val(spec[1:-1]), _val(spec[-1]) if len(spec) > 1 else "")
                )
    return rows


def _names(value: Any) -> list[str]:
    if not value:
        return []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def value_text(value: Any) -> str:
    """A plan value in words: ``yes``/``no``, a list joined, a mapping as JSON; never
    ``null`` (the caller leaves out what has no value)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(value_text(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def sglang_line(plan: Mapping[str, Any]) -> str | None:
    """Which SGLang a launch would run, or that there is none (a load would fail)."""
    python = plan.get("python")
    where = f" ({python})" if python else ""
    if plan.get("sglang_error"):
        return f"  sglang:      MISSING: {plan['sglang_error']}"
    if plan.get("sglang"):
        return f"  sglang:      {plan['sglang']}{where}"
    if "sglang" in plan:  # a daemon before issue 43: null, and nothing said of why
        return f"  sglang:      MISSING: not found in {python or 'the engine Python'}"
    return None


def plan_text(alias: str, plan: Mapping[str, Any]) -> str:
    """``load --dry-run``: what would run, where, and what it would displace."""
    out = [f"plan for {plan.get('alias', alias)} (dry run: nothing was started)"]
    if plan.get("state"):
        running = f", pid {plan['running_pid']}" if plan.get("running_pid") else ""
        out.append(f"  now:         {plan['state']}{running}")
    line = sglang_line(plan)
    if line:
        out.append(line)
    argv = plan.get("argv")
    if argv:
        out += ["  command:", argv_text([str(a) for a in argv])]
    env = plan.get("env")
    if isinstance(env, Mapping) and env:
        import shlex

        out.append("  environment:")
        out += [f"    {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    numa = plan.get("numa_nodes")
    if numa is not None:
        out.append(f"  numa nodes:  {ranges(numa) if numa else 'any'}")
    cpus = plan.get("cpus")
    if cpus is not None:
        shown = plan.get("cpulist") or ranges(cpus)
        out.append(
            f"  cpus:        {shown} ({len(set(cpus))} cpus)" if cpus else "  cpus:        any"
        )
    gpus = plan.get("gpus")
    if gpus is not None:
        out.append(f"  gpus:        {ranges(gpus) if gpus else 'none'}")
    rows = _flag_rows(plan.get("flags"))
    if rows:
        out.append("  flags:")
        width = max(len(f"{n} {v}".strip()) for n, v, _ in rows)
        for name, value, origin in rows:
            text = f"{name} {value}".strip()
            out.append(f"    {text.ljust(width)}  ({origin})" if origin else f"    {text}")
    if "evict" in plan:
        # Who is put to sleep is said so, not "evicted" (issue 43).
        sleeps = _names(plan.get("sleeps"))
        evict = [a for a in _names(plan.get("evict")) if a not in sleeps]
        if evict or not sleeps:
            out.append(f"  would evict: {', '.join(evict) if evict else 'nothing'}")
        if sleeps:
            out.append(f"  would put to sleep: {', '.join(sleeps)}")
    blocked = _names(plan.get("blocked_by"))
    reason = plan.get("reason") or plan.get("error")
    if blocked or plan.get("ok") is False:
        by = f" by {', '.join(blocked)}" if blocked else ""
        never = " (never on this machine)" if plan.get("impossible") else ""
        out.append(f"  BLOCKED{by}{never}" + (f": {reason}" if reason else ""))
    elif reason:
        out.append(f"  note: {reason}")
    out += [f"  note: {n}" for n in _names(plan.get("notes"))]
    out += estimate_lines(plan)
    for key, value in plan.items():
        if key not in _PLAN_KEYS and value is not None:
            out.append(f"  {key}: {value_text(value)}")
    return "\n".join(out)


def estimate_lines(plan: Mapping[str, Any]) -> list[str]:
    """The memory estimate and the fit verdict of a dry-run plan (``load --estimate``)."""
    est = plan.get("estimate")
    if not isinstance(est, Mapping):
        return []
    out = ["  memory estimate:"]
    out.append(f"    host RAM (experts):   {gib(est.get('host_bytes'))}")
    gpu = est.get("gpu_bytes")
    line = f"    GPU (weights + KV):   {gib(gpu)}"
    if gpu is not None:
        line += (
            f" = {gib(est.get('gpu_weights_bytes') or 0)} + "
            f"{gib(est.get('kv_cache_bytes') or 0)} KV for ctx {est.get('ctx')}"
        )
    out.append(line)
    out += [f"    note: {n}" for n in _names(est.get("notes"))]
    verdict = plan.get("fit")
    if isinstance(verdict, Mapping):
        for row in verdict.get("rows") or []:
            if isinstance(row, Mapping):
                free = "no GPU" if row.get("what") == "GPU memory" else gib(row.get("free"))
                out.append(
                    f"    {row.get('what')!s:<20}  needs {gib(row.get('need'))}, free {free}"
                )
        out += [f"    note: {n}" for n in _names(verdict.get("notes"))]
        if verdict.get("ok"):
            out.append("    fits")
        else:
            ignore = verdict.get("policy") == "ignore"
            ignored = " (fit: ignore, would load anyway)" if ignore else ""
            out.append(f"    DOES NOT FIT{ignored}: {verdict.get('reason')}")
            if verdict.get("no_gpu") and verdict.get("refuses") is False and not ignore:
                out.append(
                    "    (a load is not refused for this alone: SGLang decides at launch; "
                    "a CPU build of it runs with --device cpu)"
                )
    return out
