"""The HTTP calls of a sleep and a wake: SGLang's memory API, its fence and its load count.

Apart from the supervisor so that what SGLang answers (``docs/sglang.md``, "Sleep") is
read in one place:

* ``POST /release_memory_occupation`` and ``POST /resume_memory_occupation`` answer 200
  (body ``null``) when done;
* ``POST /pause_generation`` with ``{"mode": "abort"}`` makes the tokenizer manager hold
  every new generation (``/health``'s own token too) before it reaches the scheduler,
  aborts what is in flight, and answers once no request is left in the tokenizer; it
  leaves the scheduler itself running (the ``retract``/``in_place`` modes pause the
  scheduler, whose loop then spins on a core for as long as the pause lasts: never
  used). ``POST /continue_generation`` lets the held requests go on;
* ``POST /flush_cache`` is answered by the scheduler in the order it receives
  requests: 200 only when nothing is running (upstream: nor waiting), 400 otherwise;
* ``GET /v1/loads`` counts the requests running and waiting over the DP ranks
  (``ktd.core.loads``).

A route this SGLang lacks answers 404 (``CallOutcome.absent``). The engine's API key goes
with every call (the admin key, for the routes SGLang reserves to it, when the user set
one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from ktd import foreign
from ktd.core import loglines
from ktd.core.loads import EngineLoad, parse
from ktd.daemon.engine.key import auth_headers

__all__ = ["CallOutcome", "cont", "flush", "pause", "read_load", "read_memory", "release", "resume"]

#: Every tag SGLang's memory saver knows; ktd releases and resumes them all.
TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass(frozen=True)
class CallOutcome:
    """How one of SGLang's control calls ended: done (``ok``), not a route of this
    SGLang (``absent``), or why not; ``at``: the wall clock when the answer came."""

    ok: bool
    absent: bool = False
    why: str | None = None
    at: float = 0.0


async def read_load(
    http: httpx.AsyncClient, base: str, *, key: str | None = None
) -> EngineLoad | None:
    """What ``/v1/loads`` counts now; None when it does not answer in SGLang's shape."""
    try:
        r = await http.get(
            base + loglines.probe_path("/v1/loads") + "&include=core",
            timeout=2.0,
            headers=auth_headers(key),
        )
        if r.status_code != 200:
            return None
        return parse(foreign.json_any(r.content))
    except (httpx.HTTPError, OSError, ValueError):
        return None


async def read_memory(
    http: httpx.AsyncClient, base: str, *, key: str | None = None
) -> dict[str, float] | None:
    """SGLang's own memory figures (``/v1/loads?include=memory``: ``weight_gb``,
    ``kv_cache_gb``, ``graph_gb``, ``token_capacity``, summed over its DP ranks); None
    when it does not say (it generates nothing: safe on a released engine)."""
    try:
        r = await http.get(
            base + "/v1/loads?include=memory", timeout=5.0, headers=auth_headers(key)
        )
        if r.status_code != 200:
            return None
        total: dict[str, float] = {}
        for entry in foreign.json_any(r.content)["loads"]:
            for name, value in (entry.get("memory") or {}).items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    total[name] = total.get(name, 0.0) + float(value)
        return total or None
    except (httpx.HTTPError, OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


async def _call(
    http: httpx.AsyncClient,
    url: str,
    timeout: float,
    key: str | None,
    body: object,
) -> CallOutcome:
    try:
        r = await http.post(url, json=body, timeout=timeout, headers=auth_headers(key))
    except httpx.TimeoutException:
        return CallOutcome(False, why=f"no answer within {timeout:g}s")
    except (httpx.HTTPError, OSError) as exc:
        return CallOutcome(False, why=f"{type(exc).__name__}: {exc}")
    at = time.time()
    if r.status_code == 404:
        return CallOutcome(False, absent=True, why="HTTP 404: not a route of this SGLang", at=at)
    if r.status_code != 200:
        return CallOutcome(False, why=f"HTTP {r.status_code}: {r.text[:200]}", at=at)
    return CallOutcome(True, at=at)


async def release(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> CallOutcome:
    """Release the engine's GPU memory."""
    url = base + "/release_memory_occupation"
    return await _call(http, url, timeout, key, {"tags": list(TAGS)})


async def resume(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> CallOutcome:
    """Take the GPU memory back."""
    url = base + "/resume_memory_occupation"
    return await _call(http, url, timeout, key, {"tags": list(TAGS)})


async def pause(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> CallOutcome:
    """Hold new requests at the tokenizer, abort what is left in flight (the fence)."""
    return await _call(http, base + "/pause_generation", timeout, key, {"mode": "abort"})


async def cont(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> CallOutcome:
    """Let held requests reach the scheduler again (after a resume)."""
    return await _call(http, base + "/continue_generation", timeout, key, {})


async def flush(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> CallOutcome:
    """Ask the scheduler, in order after everything sent before, whether it is idle."""
    return await _call(http, base + "/flush_cache", timeout, key, None)
