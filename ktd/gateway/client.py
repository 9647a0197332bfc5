"""The HTTP I/O against one sglang-router's worker API (httpx on trio).

The router (sgl-model-gateway 0.3.x) keys workers by a UUID it assigns:
``POST /workers`` {url, model_id, labels, api_key, health_*} → 202 with
``worker_id`` (the add runs as a background job: health check, ``/server_info``,
``/model_info``); ``GET /workers`` → ``{"workers": [{id, url, model_id,
is_healthy, metadata: labels…}], …}``; ``DELETE /workers/{id}`` → 202.
Anything else (connection refused, timeout, 5xx, a body of another shape) is a
``RouterError``: the caller backs off, nothing here retries or sleeps.
"""

from __future__ import annotations

from typing import Any

import httpx

from ktd import foreign
from ktd.gateway.plan import Listed, Worker


class RouterError(Exception):
    """The router could not be reached or answered something unusable."""


class RouterClient:
    def __init__(
        self,
        base_url: str,
        http: httpx.AsyncClient,
        *,
        api_key: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = http
        self.timeout = timeout
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    async def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            return await self.http.request(
                method,
                self.base_url + path,
                json=body,
                headers=self.headers,
                timeout=self.timeout,
            )
        except (httpx.HTTPError, OSError) as exc:
            raise RouterError(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _fail(r: httpx.Response, what: str) -> RouterError:
        text = r.text[:300].strip()
        return RouterError(f"{what}: HTTP {r.status_code}" + (f": {text}" if text else ""))

    async def list_workers(self) -> list[Listed]:
        r = await self._call("GET", "/workers")
        if r.status_code != 200:
            raise self._fail(r, "GET /workers")
        try:
            return parse_workers(foreign.json_any(r.content))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RouterError(f"GET /workers: unexpected body: {exc}") from None

    async def add(
        self,
        worker: Worker,
        *,
        worker_api_key: str | None,
        health_check_interval: int,
    ) -> str | None:
        """Queue the registration; returns the router's worker id when it gives one."""
        body: dict[str, Any] = {
            "url": worker.url,
            "model_id": worker.model_id,
            "labels": worker.label_dict(),
            "health_check_interval_secs": health_check_interval,
        }
        if worker_api_key:
            body["api_key"] = worker_api_key
        r = await self._call("POST", "/workers", body)
        if r.status_code not in (200, 201, 202):
            raise self._fail(r, "POST /workers")
        try:
            doc = foreign.json_any(r.content)
        except ValueError:
            return None
        wid = doc.get("worker_id") if isinstance(doc, dict) else None
        return wid if isinstance(wid, str) else None

    async def update_labels(self, worker_id: str, labels: dict[str, str]) -> None:
        """``PUT /workers/{id}``: new labels in place, the worker keeps serving."""
        r = await self._call("PUT", f"/workers/{worker_id}", {"labels": labels})
        if r.status_code not in (200, 202, 204):
            raise self._fail(r, "PUT /workers")

    async def remove(self, worker_id: str) -> None:
        """Queue the removal; a worker the router no longer has is not an error."""
        r = await self._call("DELETE", f"/workers/{worker_id}")
        if r.status_code not in (200, 202, 204, 404):
            raise self._fail(r, "DELETE /workers")


def parse_workers(doc: Any) -> list[Listed]:
    """``GET /workers``'s body → ``Listed`` entries (labels are in ``metadata``)."""
    items = doc["workers"] if isinstance(doc, dict) else doc
    out: list[Listed] = []
    for w in items:
        meta = w.get("metadata") or w.get("labels") or {}
        out.append(
            Listed(
                id=str(w.get("id") or w["url"]),
                url=str(w["url"]),
                model_id=str(w.get("model_id") or ""),
                labels={str(k): str(v) for k, v in meta.items()},
                healthy=bool(w.get("is_healthy", True)),
            )
        )
    return out
