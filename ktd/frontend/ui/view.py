"""What the dashboard shows, built from the daemon's answers. Pure.

One card per configured model (``models`` lists them all, ``status`` has the
served ones in detail) and the machine (``machine``: nodes, GPUs, holders, and
the host memory asleep engines keep on their nodes); the traffic rates travel
apart, with the series they end (hub.py). The page does its own clock arithmetic
(uptime, TTL countdowns, load progress, time asleep) from the wall-clock instants
given here, so the view only changes when something did, and pushes are rare.

Secrets never reach a browser: argv values and environment entries whose flag or
name says key, token, secret or password are masked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ktd import protocol as p
from ktd.core import states as S
from ktd.core.cpulist import format_cpulist
from ktd.pullwire import PullInfo

MASK = "***"
_SECRET = re.compile(r"(key|token|secret|passw)", re.IGNORECASE)


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``--api-key X`` / ``--api-key=X`` -> ``--api-key ***``; everything else as is."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next and not word.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if word.startswith("--"):
            flag, eq, _ = word.partition("=")
            if is_secret(flag):
                if eq:
                    out.append(f"{flag}={MASK}")
                    continue
                hide_next = True
        out.append(word)
    return out


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def redact_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A dry-run plan as the dashboard may show it."""
    out = dict(plan)
    if isinstance(out.get("argv"), list):
        out["argv"] = redact_argv([str(w) for w in out["argv"]])
    if isinstance(out.get("env"), dict):
        out["env"] = redact_env(out["env"])
    if isinstance(out.get("argv_flags"), list):
        out["argv_flags"] = redact_argv([str(w) for w in out["argv_flags"]])
    flags = out.get("flags")
    if isinstance(flags, list):
        out["flags"] = [
            {**f, "values": [MASK]} if isinstance(f, dict) and is_secret(str(f.get("name"))) else f
            for f in flags
        ]
    return out


#: The status fields a card shows as they are (the rest are derived below): the
#: dashboard's projection of ``EngineInfo``, the one list ``cards.js`` reads.
CARD_FIELDS = (
    "state",
    "phase",
    "reason",
    "since",
    "started_at",
    "load_started",
    "load_eta",
    "ttl",
    "expires_at",
    "last_used",
    "in_flight",
    "queued",
    "claims",
    "max_concurrent",
    "max_queue",
    "restarts",
    "evictions",
    "loads",
    "load_seconds",
    "failures",
    "retry_in",
    "url",
    "pid",
    "port",
    "sglang",
    "pinned",
    "stale",
    "last_log",
    "sleep",
    "asleep_since",
    "sleep_ttl",
    "host_bytes",
)


def card(model: p.ModelInfo, engine: p.EngineInfo | None, colour: int) -> dict[str, Any]:
    """One model's card. ``engine`` is None for a model ktd does not serve (or not yet)."""
    base: dict[str, Any] = {
        "alias": model.alias,
        "backend": model.backend,
        "served": model.served,
        "path": model.path,
        "colour": colour,
        "state": model.state,
        "reason": model.reason,
    }
    if engine is None:
        return base
    e = engine
    base.update({name: getattr(e, name) for name in CARD_FIELDS})
    base.update(
        argv=redact_argv(e.argv),
        notes=list(e.notes),
        numa_nodes=list(e.numa_nodes),
        gpus=list(e.gpus),
        cpulist=format_cpulist(e.cpus) if e.cpus else "",
        gateway=[{"router": r.router, "state": r.state} for r in e.gateway],
        sleep_expires=sleep_expires(e),
    )
    return base


def sleep_expires(e: p.EngineInfo) -> float | None:
    """When an asleep engine's ``sleep_ttl`` stops it (wall clock); None: never, or awake."""
    if e.state != S.ASLEEP or e.sleep_ttl <= 0 or e.asleep_since is None:
        return None
    return e.asleep_since + e.sleep_ttl


def host_shares(engines: Sequence[p.EngineInfo]) -> dict[int, list[dict[str, Any]]]:
    """NUMA node -> ``[{"alias", "bytes"}]``: host memory asleep engines keep there.

    An asleep engine holds no CPU and no GPU (so it is no holder; others may be placed
    on its nodes) but its experts stay in host RAM: ``host_bytes``, split evenly over
    its nodes as it was placed (kt-kernel spreads experts over them)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for e in engines:
        if e.state != S.ASLEEP or not e.host_bytes or not e.numa_nodes:
            continue
        share = e.host_bytes // len(e.numa_nodes)
        for n in e.numa_nodes:
            out.setdefault(n, []).append({"alias": e.alias, "bytes": share})
    return out


def machine(m: p.MachineReply, engines: Sequence[p.EngineInfo] = ()) -> dict[str, Any]:
    """Nodes and GPUs, each part named with the engines that hold it; on each node, also
    the host memory that asleep engines (``engines``, from status) keep there."""
    asleep = host_shares(engines)
    node_holders: dict[int, list[str]] = {}
    gpu_holders: dict[int, list[str]] = {}
    cpu_owner: dict[int, str] = {}
    for h in m.holders:
        for n in h.numa_nodes:
            node_holders.setdefault(n, []).append(h.alias)
        for g in h.gpus:
            gpu_holders.setdefault(g, []).append(h.alias)
        for c in h.cpus:
            cpu_owner[c] = h.alias
    return {
        "cpu_model": m.cpu_model,
        "nodes": [
            {
                "id": n.id,
                "cpus": list(n.cpus),
                "cpulist": format_cpulist(n.cpus),
                "mem_total": n.mem_total,
                "mem_free": n.mem_free,
                "mem_available": n.mem_available,
                "holders": node_holders.get(n.id, []),
                "asleep": asleep.get(n.id, []),
            }
            for n in m.nodes
        ],
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_total": g.memory_total,
                "memory_used": g.memory_used,
                "holders": gpu_holders.get(g.index, []),
            }
            for g in m.gpus
        ],
        "gpu_error": m.gpu_error,
        "reserved_cpus": list(m.reserved_cpus),
        # [cpu, alias] pairs: JSON objects cannot have integer keys.
        "cpu_owner": [[c, cpu_owner[c]] for c in sorted(cpu_owner)],
        "holders": [{"alias": h.alias, "state": h.state} for h in m.holders],
    }


#: What the pulls panel shows of a job (``ktd.pullwire.PullInfo``): the bar's numbers, and
#: a failure's kind and message.
PULL_FIELDS = (
    "repo",
    "revision",
    "names",
    "state",
    "phase",
    "file",
    "total",
    "done",
    "rate",
    "eta",
    "restarts",
    "kind",
    "message",
)


def pull_row(job: PullInfo) -> dict[str, Any]:
    """A pull job as the page draws it: ``fraction`` is None until the plan gave a total."""
    row = {f: getattr(job, f) for f in PULL_FIELDS}
    row["names"] = list(job.names)
    row["key"] = job.key
    row["fraction"] = min(1.0, job.done / job.total) if job.total > 0 else None
    return row


def build(
    models: Sequence[p.ModelInfo],
    engines: Sequence[p.EngineInfo],
    machine_reply: p.MachineReply | None,
    *,
    daemon_error: str | None = None,
    pulls: Sequence[PullInfo] = (),
) -> dict[str, Any]:
    """The whole view. Colours follow the configured order, so they are stable."""
    by_alias = {e.alias: e for e in engines}
    listed = list(models)
    known = {m.alias for m in listed}
    for e in engines:  # a served engine the models reply missed (should not happen)
        if e.alias not in known:
            listed.append(p.ModelInfo(alias=e.alias, backend="kt", served=True, path=""))
    cards = [card(m, by_alias.get(m.alias), i) for i, m in enumerate(listed)]
    return {
        "daemon": {"up": daemon_error is None, "error": daemon_error},
        "models": cards,
        "machine": machine(machine_reply, engines) if machine_reply is not None else None,
        "loads": dict(machine_reply.load_history) if machine_reply is not None else {},
        "pulls": [pull_row(j) for j in pulls],
    }
