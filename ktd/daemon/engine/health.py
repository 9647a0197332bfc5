"""The HTTP questions the supervisor asks an engine: is it up, is it still answering.

Apart from the supervisor so that what "ready" means for SGLang (the model listed
by /v1/models *and* /health 200, since /v1/models answers before warm-up ends)
is written in one place, away from the state machine that acts on the answer.
Every path goes through ``loglines.probe_path`` so the engine log can hide probes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import trio

from ktd import foreign
from ktd.core import loglines
from ktd.core import states as S
from ktd.daemon.engine.key import auth_headers

__all__ = ["Watch", "answers_health", "engine_url", "is_ready"]


def engine_url(host: str, port: int) -> str:
    """Where to reach an engine bound to ``host``: a wildcard bind is reached on loopback."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


async def answers_health(
    http: httpx.AsyncClient, base: str, *, timeout: float, key: str | None = None
) -> bool:
    """``GET /health`` answered 200 within ``timeout``. (SGLang leaves ``/health`` open
    whatever its key; ktd sends the key all the same: one rule for every request.)"""
    try:
        r = await http.get(
            base + loglines.probe_path("/health"), timeout=timeout, headers=auth_headers(key)
        )
    except (httpx.HTTPError, OSError):
        return False
    return r.status_code == 200


async def is_ready(
    http: httpx.AsyncClient, base: str, alias: str, *, key: str | None = None
) -> bool:
    """SGLang answers /v1/models before warm-up ends; /health says when it really is up.
    ``key``: the engine's API key (``/v1/models`` answers 401 without it)."""
    headers = auth_headers(key)
    try:
        r = await http.get(base + loglines.probe_path("/v1/models"), timeout=2.0, headers=headers)
        if r.status_code != 200:
            return False
        ids = [m.get("id") for m in foreign.json_any(r.content).get("data", [])]
        if alias not in ids:
            return False
        h = await http.get(base + loglines.probe_path("/health"), timeout=20.0, headers=headers)
        return h.status_code == 200
    except (httpx.HTTPError, OSError, ValueError, AttributeError):
        return False


class Watch:
    """One run's health as the supervisor reads it: ``healthy`` once a starting engine
    answers as ready, ``hung`` once a ready one stopped answering ``/health`` for
    ``hang_timeout``. ``ready_line`` is set when the log says SGLang is up, so the
    next readiness probe goes at once instead of at the backoff's pace."""

    def __init__(self) -> None:
        self.healthy = False
        self.hung = False
        self.ready_line = trio.Event()
        self._probing = 0  # probes in flight (each /health generates a token)
        self._quiet = trio.Event()
        self._quiet.set()

    async def quiet(self) -> None:
        """Until no probe of this watch is in flight: a release must not meet one (SGLang
        asserts that nothing runs when it releases). No new one starts once the engine
        is not starting or ready."""
        await self._quiet.wait()

    async def _probe(self, ask: Awaitable[bool]) -> bool:
        self._probing += 1
        self._quiet = trio.Event()
        try:
            return await ask
        finally:
            self._probing -= 1
            if not self._probing:
                self._quiet.set()

    async def run(
        self,
        http: httpx.AsyncClient,
        base: Callable[[], str],
        alias: str,
        *,
        state: Callable[[], str],
        wake: Callable[[], None],
        health_interval: float,
        hang_timeout: float,
        key: str | None = None,
    ) -> None:
        """Probe the engine at ``base()`` until hung (``wake`` is called on each
        verdict); ``state`` is the engine's current state, which says what to ask."""
        interval = 0.05
        last_ok = trio.current_time()
        while True:
            if state() == S.STARTING and not self.healthy:
                if await self._probe(is_ready(http, base(), alias, key=key)):
                    self.healthy = True
                    wake()
                    continue
                with trio.move_on_after(interval):
                    await self.ready_line.wait()
                interval = min(interval * 1.5, 0.5)
            elif state() == S.READY:
                await trio.sleep(health_interval)
                if state() != S.READY:
                    last_ok = trio.current_time()  # asleep meanwhile: no silence to count
                    continue
                if await self._probe(answers_health(http, base(), timeout=hang_timeout, key=key)):
                    last_ok = trio.current_time()
                elif trio.current_time() - last_ok >= hang_timeout:
                    self.hung = True
                    wake()
                    return
            else:
                # Asleep, going to sleep or waking: nothing that generates is sent (a
                # /health generates a token); the wake checks readiness itself.
                last_ok = trio.current_time()
                await trio.sleep(0.2)
