"""What the frontend knows about engines beyond a lease: their cards, adapters, response ids.

Why: ``/v1/models`` must list LoRA adapters and ``alias:adapter`` must route
only when the engine really serves that adapter; both come from the engine's
own ``/v1/models`` (SGLang lists adapters there with ``parent`` = the served
name), cached for a few seconds so a busy frontend asks once, not per request.
``GET /v1/responses/{id}`` must reach the engine that made the response, so
ids seen in Responses answers are remembered (bounded, oldest dropped).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import msgspec
import trio

from ktd import foreign
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.frontend.broker import ClaimBroker
from ktd.frontend.upstream import UpstreamError, UpstreamPool

CARD_TTL = 3.0
_cards: dict[str, tuple[float, list[dict[str, Any]]]] = {}


async def engine_cards(
    pool: UpstreamPool, url: str, timeout: float = 5.0
) -> list[dict[str, Any]] | None:
    """The engine's ``/v1/models`` cards, or None if it could not be asked."""
    hit = _cards.get(url)
    now = time.monotonic()
    if hit is not None and now - hit[0] < CARD_TTL:
        return hit[1]
    try:
        with trio.fail_after(timeout):
            resp = await pool.request(url, b"/v1/models", [], b"", method=b"GET")
            try:
                data = await resp.read()
            finally:
                resp.close()
    except (UpstreamError, trio.TooSlowError):
        return None
    if resp.status != 200:
        return None
    try:
        obj = foreign.json_any(data)
    except msgspec.DecodeError:
        return None
    cards = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(cards, list):
        return None
    good = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
    if len(_cards) > 256:
        _cards.clear()
    _cards[url] = (now, good)
    return good


async def engine_adapters(pool: UpstreamPool, url: str, alias: str) -> list[str] | None:
    """Names of the LoRA adapters the engine serves for ``alias`` (None: unknown)."""
    cards = await engine_cards(pool, url)
    if cards is None:
        return None
    return [c["id"] for c in cards if c.get("parent") == alias and c["id"] != alias]


async def all_engines(broker: ClaimBroker) -> list[p.EngineInfo]:
    """Every engine the daemon reports (empty when it cannot be asked)."""
    try:
        reply = await broker.request(p.Status(), timeout=2.0)
    except (Unreachable, ControlError):
        return []
    return list(reply.engines) if isinstance(reply, p.StatusReply) else []


async def ready_engines(broker: ClaimBroker) -> list[p.EngineInfo]:
    """Engines the daemon reports ready (empty when it cannot be asked)."""
    return [e for e in await all_engines(broker) if e.state == S.READY and e.url]


async def engine_status(broker: ClaimBroker, alias: str) -> p.EngineInfo | None:
    try:
        reply = await broker.request(p.Status(alias=alias), timeout=1.0)
    except (Unreachable, ControlError):
        return None
    if isinstance(reply, p.StatusReply) and reply.engines:
        return reply.engines[0]
    return None


class ResponseBook:
    """``resp_...`` id -> the alias whose engine created it; the newest ``size`` kept."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ids: OrderedDict[str, str] = OrderedDict()

    def add(self, response_id: str, alias: str) -> None:
        self._ids[response_id] = alias
        self._ids.move_to_end(response_id)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def get(self, response_id: str) -> str | None:
        return self._ids.get(response_id)
