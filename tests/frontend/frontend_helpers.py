"""Helpers shared by the frontend tests (importable; conftest modules are not)."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from ktd.frontend.state import State

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
    full = {"PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))), "KTD_SIM_LOAD_TIME": "0.1"}
    full.update({k: str(v) for k, v in env.items()})
    from tests.conftest import sim_paths

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
