"""The HTTP calls of a sleep and a wake: SGLang's memory API and its load counter.

Apart from the supervisor so that what SGLang answers (``docs/sglang.md``, "Sleep")
is read in one place: ``POST /release_memory_occupation`` and
``POST /resume_memory_occupation`` answer 200 (body ``null``) when done, and
``GET /v1/loads`` counts the requests running and waiting over the engine's DP
ranks. A release is only sent once ``/v1/loads`` counted zero (``ktd.core.lifecycle``).
The engine's API key, when it has one, goes with every call.
"""

from __future__ import annotations

from typing import Any

import httpx

from ktd.core import loglines
from ktd.daemon.enginekey import auth_headers

__all__ = ["in_flight", "read_load", "release", "resume"]

#: Every tag SGLang's memory saver knows; ktd releases and resumes them all.
TAGS = ("weights", "kv_cache", "cuda_graph")


def in_flight(loads: Any) -> int:
    """Requests an SGLang ``/v1/loads`` answer counts, running and waiting, over its DP ranks.

    Raises KeyError/TypeError/AttributeError/ValueError on an answer of another shape."""
    return sum(
        int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0))
        for x in loads["loads"]
    )


async def read_load(http: httpx.AsyncClient, base: str, *, key: str | None = None) -> int | None:
    """What ``/v1/loads`` counts now; None when it does not answer in SGLang's shape."""
    try:
        r = await http.get(
            base + loglines.probe_path("/v1/loads") + "&include=core",
            timeout=2.0,
            headers=auth_headers(key),
        )
        if r.status_code != 200:
            return None
        return in_flight(r.json())
    except (httpx.HTTPError, OSError, ValueError, TypeError, AttributeError, KeyError):
        return None


async def _call(http: httpx.AsyncClient, url: str, timeout: float, key: str | None) -> str | None:
    try:
        r = await http.post(
            url, json={"tags": list(TAGS)}, timeout=timeout, headers=auth_headers(key)
        )
    except httpx.TimeoutException:
        return f"no answer within {timeout:g}s"
    except (httpx.HTTPError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    return None


async def release(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> str | None:
    """Release the engine's GPU memory; None when done, else why not."""
    return await _call(http, base + "/release_memory_occupation", timeout, key)


async def resume(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> str | None:
    """Take the GPU memory back; None when done, else why not."""
    return await _call(http, base + "/resume_memory_occupation", timeout, key)
