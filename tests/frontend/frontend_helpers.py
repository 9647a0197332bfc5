"""Helpers shared by the frontend tests (importable; conftest modules are not)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from ktd.frontend.state import State
from tests.frontend.frontend_fakes import FakeEngine

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "ktd" / "sim" / "shim"


@dataclass
class Frontend:
    url: str
    state: State
    scope: trio.CancelScope
    shutdown: trio.Event  # set = Hypercorn's graceful shutdown (as on SIGTERM)
    app: Any = None  # the QuartTrio app

    def client(self, **kw: Any) -> httpx.AsyncClient:
        """A client that labels a raw body as JSON, as the official clients do (the
        frontend refuses other body types on JSON routes, ktd.frontend.origin); ``json=``,
        ``files=`` and ``data=`` keep the type httpx gives them."""
        kw.setdefault("timeout", 10.0)
        kw.setdefault("event_hooks", {"request": [_json_by_default]})
        return httpx.AsyncClient(base_url=self.url, **kw)


async def _json_by_default(request: httpx.Request) -> None:
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    if has_body and "content-type" not in request.headers:
        request.headers["content-type"] = "application/json"


StartFrontend = Callable[..., Awaitable[Frontend]]


async def wait_for(pred: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    with trio.move_on_after(timeout):
        while not pred():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what or pred}")


def sim_entry(alias: str, **env: Any) -> dict[str, Any]:
    """A models.json entry whose engine is the sim, through the sglang shim."""
    from tests.conftest import SIM_TIMES, sim_paths

    full = {"PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))), **SIM_TIMES}
    full.update({k: str(v) for k, v in env.items()})

    model_path, weights = sim_paths(alias)
    return {
        "path": model_path,
        "backend": "kt",
        "alias": alias,
        "kt": {"extra_env": full, "kt_weight_path": weights},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CHAT = "/v1/chat/completions"


def body(model: str = "m", stream: bool = False, **extra: object) -> bytes:
    """A chat request's body for the fakes (they read only ``model`` and ``stream``)."""
    return json.dumps({"model": model, "stream": stream, "messages": [], **extra}).encode()


@asynccontextmanager
async def held_stream(
    fe: Frontend, fake_engine: FakeEngine
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.Response]]:
    """A slow stream on ``m`` under way (its first event seen) for the block's duration:
    the client, and the stream (``aclose()`` it to end it early; leaving the block hangs
    up mid-stream)."""
    fake_engine.chunks = 10_000
    fake_engine.chunk_delay = 0.01
    async with fe.client() as c, c.stream("POST", CHAT, content=body(stream=True)) as held:
        chunks = held.aiter_raw()  # kept: a dropped iterator closes the stream
        async for chunk in chunks:
            if chunk.startswith(b"data: {"):
                break
        yield c, held
