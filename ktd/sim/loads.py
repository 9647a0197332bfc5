"""``GET /v1/loads``: SGLang 0.5.23's load route (it has no ``/get_load``).

Why exact: ktd's gateway reads it before an evict (no request may be left on an
engine the router still routes to), the frontend proxies it and sums it for
sglang-router's ``/get_load`` in frontend mode. Shape, as
``entrypoints/v1_loads.py`` and ``managers/load_snapshot.py`` make it:
``{"timestamp": <ISO>, "version", "accelerator", "num_accelerators", "loads":
[{<core fields>, "memory", "disaggregation", "queues"}]}``, one entry per DP rank.

Query, as the real route reads it: ``dp_rank`` (an int: only that rank; any other
value is FastAPI's 400), ``include`` (comma-separated sections of core, memory,
spec, lora, disagg, queues, all; ``core`` alone drops the sections; an unknown one
raises inside SGLang: a bare 500), ``format=prometheus`` (one gauge per number).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.shapes import json_reply, validation_reply

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def snapshot(
    *,
    running: int,
    max_total_tokens: int,
    max_running: int,
    used_tokens: int = 0,
    taken: float | None = None,
) -> dict[str, Any]:
    """One DP rank's load, every section the CPU engine reports (no spec, no LoRA);
    ``taken``: when its figures were taken (upstream: its snapshot's publication)."""
    return {
        "timestamp": time.time() if taken is None else taken,
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": 0,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": used_tokens,
        "num_total_tokens": 0,
        "num_active_tokens": 0,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": max_total_tokens,
        "max_running_requests": max_running,
        "token_usage": 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": 0.0,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
        "memory": {
            "weight_gb": 0.0,
            "kv_cache_gb": 0.0,
            "graph_gb": 0.0,
            "token_capacity": max_total_tokens,
        },
        "disaggregation": {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        },
        "queues": {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }


_SECTION_NAMES = {"memory": "memory", "disaggregation": "disagg", "queues": "queues"}
_PROM_PREFIX = {"disaggregation": "disagg"}


def _filtered(load: dict[str, Any], include: set[str] | None) -> dict[str, Any]:
    if include is None or "all" in include:
        return load
    return {
        k: v
        for k, v in load.items()
        if not isinstance(v, dict) or _SECTION_NAMES.get(k, k) in include
    }


def _prometheus(loads: list[dict[str, Any]]) -> str:
    samples: dict[str, list[tuple[int, object]]] = {}
    for load in loads:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            if isinstance(value, dict):
                prefix = _PROM_PREFIX.get(key, key)
                for sub, v in value.items():
                    if isinstance(v, int | float):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((rank, v))
            elif isinstance(value, int | float):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {v}' for rank, v in values]
    return "\n".join(lines) + "\n"


def reply(req: HttpRequest, load: dict[str, Any], version: str) -> HttpReply:
    query = parse_qs(req.target.partition("?")[2])
    rank_arg = query.get("dp_rank", [None])[-1]
    if rank_arg is not None:
        try:
            rank: int | None = int(rank_arg)
        except ValueError:
            err = {
                "type": "int_parsing",
                "loc": ("query", "dp_rank"),
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": rank_arg,
            }
            return validation_reply([err])
    else:
        rank = None
    inc = query.get("include", [None])[-1]
    include = {s.strip() for s in inc.split(",")} if inc else None
    if include is not None and not include <= SECTIONS:
        # SGLang's ValueError is raised outside its handler's try: uvicorn's bare 500.
        return HttpReply(500, b"Internal Server Error", "text/plain; charset=utf-8")
    loads = [_filtered(load, include)] if rank in (None, load["dp_rank"]) else []
    if query.get("format", [None])[-1] == "prometheus":
        return HttpReply(200, _prometheus(loads).encode(), _PROMETHEUS)
    return json_reply(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": version,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": loads,
        }
    )
