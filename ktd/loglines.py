"""What an engine's log lines mean to ktd: load milestones, and ktd's own probe traffic.

Status shows a *phase* ("loading weights"), never a raw log line; SGLang's
milestone lines say which phase a load is in. And ktd's health checks make
uvicorn log an access line every few seconds per engine: kept out of
``ktctl logs`` and the ``log.*`` events unless asked for, they would bury the
lines that matter. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["is_probe_access", "phase_of", "split_probe_access"]

#: (substring of an SGLang line, the phase it starts), checked in order.
_MILESTONES = (
    ("Load weight begin", "loading weights"),
    ("Loading safetensors checkpoint shards", "loading weights"),
    ("Load weight end", "weights loaded"),
    ("KV Cache is allocated", "allocating KV cache"),
    ("Capture cuda graph begin", "capturing CUDA graphs"),
    ("Capture cuda graph end", "CUDA graphs captured"),
    ("Uvicorn running on", "warming up"),
    ("Application startup complete", "warming up"),
)

#: uvicorn's access line for the GETs ktd itself sends (readiness and health checks).
_PROBE = re.compile(r'"GET (?:/health|/health_generate|/v1/models) HTTP/[\d.]+" \d{3}')


def phase_of(line: str) -> str | None:
    """The load phase ``line`` announces, or None."""
    for marker, phase in _MILESTONES:
        if marker in line:
            return phase
    return None


def is_probe_access(line: str) -> bool:
    return _PROBE.search(line) is not None


def split_probe_access(lines: Iterable[str]) -> tuple[list[str], list[str]]:
    """(ordinary lines, probe access lines), order kept within each."""
    keep: list[str] = []
    probes: list[str] = []
    for line in lines:
        (probes if is_probe_access(line) else keep).append(line)
    return keep, probes
