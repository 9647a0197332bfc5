"""The HTTP questions the supervisor asks an engine: is it up, is it still answering.

Apart from the supervisor so that what "ready" means for SGLang (the model listed
by /v1/models *and* /health 200, since /v1/models answers before warm-up ends)
is written in one place, away from the state machine that acts on the answer.
Every path goes through ``loglines.probe_path`` so the engine log can hide probes.
"""

from __future__ import annotations

import httpx

from ktd.core import loglines

__all__ = ["answers_health", "engine_url", "is_ready"]


def engine_url(host: str, port: int) -> str:
    """Where to reach an engine bound to ``host``: a wildcard bind is reached on loopback."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


async def answers_health(http: httpx.AsyncClient, base: str, *, timeout: float) -> bool:
    """``GET /health`` answered 200 within ``timeout``."""
    try:
        r = await http.get(base + loglines.probe_path("/health"), timeout=timeout)
    except (httpx.HTTPError, OSError):
        return False
    return r.status_code == 200


async def is_ready(http: httpx.AsyncClient, base: str, alias: str) -> bool:
    """SGLang answers /v1/models before warm-up ends; /health says when it really is up."""
    try:
        r = await http.get(base + loglines.probe_path("/v1/models"), timeout=2.0)
        if r.status_code != 200:
            return False
        ids = [m.get("id") for m in r.json().get("data", [])]
        if alias not in ids:
            return False
        h = await http.get(base + loglines.probe_path("/health"), timeout=20.0)
        return h.status_code == 200
    except (httpx.HTTPError, OSError, ValueError, AttributeError):
        return False
