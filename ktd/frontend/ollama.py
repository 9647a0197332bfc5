"""Ollama's API: the answers the frontend makes itself, over every configured model.

``/api/chat`` and ``/api/generate`` are proxied to the engine like the OpenAI
routes (routes.py, flow.py: routing, on-demand load, queue, claims, admission;
SGLang serves Ollama's API itself). What an engine cannot answer for ktd, this
module does, on raw ASGI ahead of Quart:

* ``GET /api/tags``: every served model, as Ollama lists installed ones
  (``alias:latest``; ``size`` = the weights from the memory estimate, the one
  ``ktctl load --estimate`` prints; ``modified_at`` = the model directory's mtime).
* ``GET /api/ps``: the ready engines, in Ollama's shape; ``expires_at`` from the
  idle TTL (a busy engine's counts from now; no TTL reads as Ollama's "Forever"),
  ``size``/``size_vram`` = host RAM + GPU and GPU alone, from the estimate. Asleep
  engines too (their process and host memory stay; a request wakes them in seconds):
  ``size_vram`` 0, ``expires_at`` when the ``sleep_ttl`` stops them (``asleep_since +
  sleep_ttl``; none: "Forever"). Engines on their way (starting, sleeping, waking,
  draining) are not listed, as Ollama lists no model while it loads.
* ``POST /api/show``: the ready engine's own answer; a model that is not loaded is
  described in SGLang's words from the config (``num_ctx`` from the estimate)
  *without loading it*: clients such as Open WebUI and Continue call it for every
  listed model, and a load here is minutes and hundreds of GB (and may evict).
* ``GET /api/version`` (ktd's version), ``GET``/``HEAD /`` (``Ollama is running``,
  what Ollama tools probe for).
* what Ollama has and ktd cannot honour (pull, push, create, copy, delete, blobs;
  embed and embeddings, which SGLang's Ollama API lacks): a 501 saying so.

Errors are Ollama's ``{"error": "..."}``; API keys apply as on the OpenAI routes
(not to ``/`` and ``/api/version``, which say nothing about the models).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ktd import __version__, ollama_shapes
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.keys import Policy
from ktd.frontend import catalog, errors
from ktd.frontend.body import parse_head, unreadable
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import (
    Receive,
    Scope,
    Send,
    drained,
    read_body_in_time,
    respond,
    send_error,
)
from ktd.frontend.proxy import control_error
from ktd.frontend.routes import Match, ollama_name
from ktd.frontend.upstream import UpstreamError

if TYPE_CHECKING:
    from ktd.frontend.state import State

_encode = msgspec.json.Encoder().encode
_JSON = b"application/json; charset=utf-8"
ESTIMATE_TTL = 60.0  # seconds an engine's memory estimate is reused
FOREVER = (2**63 - 1) / 1e9  # Go's longest Duration: Ollama's keep_alive -1
# What ``/api/ps`` lists: loaded models. An asleep engine is loaded in host RAM (a
# request wakes it in seconds, not a load's minutes); it holds no VRAM.
PS_STATES = frozenset({S.READY, S.ASLEEP})

_PULL = (
    "ktd serves the models configured in models.json; it does not {} models "
    "(edit models.json, then run `ktctl reload`)"
)
#: What Ollama has and ktd cannot honour, by routes.py endpoint: why, in a 501.
NOT_SERVED: dict[str, str] = {
    "pull": _PULL.format("pull"),
    "push": _PULL.format("push"),
    "create": _PULL.format("create"),
    "blobs": _PULL.format("create"),
    "copy": _PULL.format("copy"),
    "delete": _PULL.format("delete"),
    "embed": (
        "SGLang's Ollama API has no embeddings: use POST /v1/embeddings (OpenAI's shape) "
        "on an engine launched with --is-embedding"
    ),
}
NOT_SERVED["embeddings_ollama"] = NOT_SERVED["embed"]


def ollama_alias(model: str) -> str:
    """The alias an Ollama request names (``name:latest`` is ``name``); another tag is a 404:
    SGLang's Ollama routes apply no LoRA adapter, so one must not be silently dropped."""
    alias, tag = ollama_name(model)
    if tag is not None:
        raise errors.make(
            "ollama_model_not_found",
            model=model,
            why=f": ktd serves Ollama's API for {alias}:latest only (SGLang's Ollama routes "
            f"apply no LoRA adapter); for the adapter use /v1/chat/completions with model {model}",
            param="model",
        )
    return alias


def digest(alias: str, path: str) -> str:
    """A stable ``sha256:...`` per model (Ollama's is its manifest's; ktd has none)."""
    return "sha256:" + hashlib.sha256(f"{alias}\0{path}".encode()).hexdigest()


def details(alias: str) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "sglang",
        "family": alias,
        "families": [alias],
        "parameter_size": "",
        "quantization_level": "",
    }


def tag_entry(model: p.ModelInfo, estimate: dict[str, Any] | None) -> dict[str, Any]:
    """One ``/api/tags`` model (pure but for the directory's mtime)."""
    est = estimate or {}
    try:
        mtime: float | None = os.stat(model.path).st_mtime
    except OSError:
        mtime = None
    name = f"{model.alias}:latest"
    return {
        "name": name,
        "model": name,
        "modified_at": ollama_shapes.timestamp(mtime),
        "size": (est.get("host_bytes") or 0) + (est.get("gpu_weights_bytes") or 0),
        "digest": digest(model.alias, model.path),
        "details": details(model.alias),
    }


def ps_entry(
    engine: p.EngineInfo, path: str, estimate: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    """One ``/api/ps`` model (pure): a ready engine, or an asleep one (no VRAM)."""
    est = estimate or {}
    gpu = est.get("gpu_bytes") or 0
    size = (est.get("host_bytes") or 0) + gpu
    if engine.state == S.ASLEEP:
        gpu = 0  # released; its host memory stays, so ``size`` is what it is awake
        if engine.sleep_ttl <= 0:
            until = now + FOREVER
        elif engine.asleep_since is not None:
            until = engine.asleep_since + engine.sleep_ttl
        else:
            until = now + engine.sleep_ttl
    elif engine.expires_at is not None:
        until = engine.expires_at
    elif engine.ttl > 0:  # busy: the TTL counts from the end of its last request
        until = now + engine.ttl
    else:
        until = now + FOREVER
    name = f"{engine.alias}:latest"
    return {
        "name": name,
        "model": name,
        "size": size,
        "digest": digest(engine.alias, path),
        "details": details(engine.alias),
        "expires_at": ollama_shapes.timestamp(until),
        "size_vram": gpu,
        "context_length": est.get("ctx") or None,
    }


def ps_rows(
    engines: list[p.EngineInfo],
    paths: dict[str, str],
    estimates: dict[str, dict[str, Any] | None],
    now: float,
) -> list[dict[str, Any]]:
    """``/api/ps``'s models (pure): the ready and asleep engines, longest left first."""
    rows = [
        ps_entry(e, paths.get(e.alias, ""), estimates.get(e.alias), now)
        for e in engines
        if e.state in PS_STATES
    ]
    rows.sort(key=lambda r: r["expires_at"], reverse=True)  # Ollama: longest left first
    return rows


class OllamaRoutes:
    """The ``owner="ollama"`` rows of routes.py: ``/`` and the ``/api/...`` not proxied."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._estimates: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def answer(self, found: Match, scope: Scope, receive: Receive, send: Send) -> None:
        route = found.route
        body = b""
        try:
            if route.endpoint == "show":
                body = await read_body_in_time(receive, *self.state.options.body_bounds)
            elif not await drained(scope, receive):
                raise _Unread
            policy = None
            if not route.open:
                policy = self.state.keys.of(scope)
            await self._answer(route.endpoint, scope, body, send, policy)
        except _Unread:
            err = unreadable("The request body could not be read.", "invalid_body")
            await send_error(send, err, close=True, ollama=True)
        except ApiError as err:
            await send_error(send, err, close=err.status in (408, 413), ollama=True)

    async def _answer(
        self, endpoint: str, scope: Scope, body: bytes, send: Send, policy: Policy | None
    ) -> None:
        why = NOT_SERVED.get(endpoint)
        if why is not None:
            raise errors.make("not_supported", method=scope["method"], path=scope["path"], why=why)
        if endpoint == "root":
            await _reply(send, 200, b"Ollama is running", b"text/plain; charset=utf-8")
        elif endpoint == "version":
            await _reply(send, 200, _encode({"version": __version__}))
        elif endpoint == "tags":
            await _reply(send, 200, _encode({"models": await self.tags(policy)}))
        elif endpoint == "ps":
            await _reply(send, 200, _encode({"models": await self.ps(policy)}))
        else:
            await self.show(body, send, policy)

    # ------------------------------------------------------------ answers

    async def tags(self, policy: Policy | None = None) -> list[dict[str, Any]]:
        models = [m for m in await self._models() if policy is None or policy.allows(m.alias)]
        ests = await self._estimates_for([m.alias for m in models])
        return [tag_entry(m, ests.get(m.alias)) for m in models]

    async def ps(self, policy: Policy | None = None) -> list[dict[str, Any]]:
        reply = await self._ask(p.Status())
        assert isinstance(reply, p.StatusReply)
        listed = [
            e
            for e in reply.engines
            if e.state in PS_STATES and (policy is None or policy.allows(e.alias))
        ]
        paths = {m.alias: m.path for m in await self._models()}
        ests = await self._estimates_for([e.alias for e in listed])
        return ps_rows(listed, paths, ests, time.time())

    async def show(self, body: bytes, send: Send, policy: Policy | None = None) -> None:
        head = parse_head(body, require_model=True, ollama=True)
        assert head.model is not None
        alias = ollama_alias(head.model)
        served = {
            m.alias
            for m in await self._models()
            if policy is None or policy.allows(m.alias)  # out of scope: as if not there
        }
        if alias not in served:
            raise errors.make("ollama_model_not_found", model=head.model, why="")
        ready = {e.alias: e for e in await catalog.ready_engines(self.state.broker)}
        engine = ready.get(alias)
        if engine is not None and engine.url:
            answered = await self._engine_show(engine.url, body)
            if answered is not None:
                status, ctype, data = answered
                await _reply(send, status, data, ctype)
                return
        est = (await self._estimates_for([alias])).get(alias) or {}
        await _reply(send, 200, _encode(ollama_shapes.show(head.model, est.get("ctx") or 0)))

    async def _engine_show(self, url: str, body: bytes) -> tuple[int, bytes, bytes] | None:
        headers = [(b"content-type", b"application/json")]
        try:
            with trio.fail_after(10):
                resp = await self.state.upstream.request(
                    url, b"/api/show", headers, body, method=b"POST"
                )
                try:
                    data = await resp.read()
                finally:
                    resp.close()
        except (UpstreamError, trio.TooSlowError):
            return None  # going away as we asked: described from the config instead
        ctype = next((v for k, v in resp.headers if k == b"content-type"), _JSON)
        return resp.status, ctype, data

    # ------------------------------------------------------------ the daemon

    async def _ask(self, msg: p.Request) -> p.Reply:
        try:
            return await self.state.broker.request(msg, timeout=10.0)
        except (Unreachable, ControlError) as exc:
            raise control_error("", exc) from None

    async def _models(self) -> list[p.ModelInfo]:
        reply = await self._ask(p.Models())
        assert isinstance(reply, p.ModelsReply)
        return [m for m in reply.models if m.served]

    async def _estimates_for(self, aliases: list[str]) -> dict[str, dict[str, Any] | None]:
        """The memory estimates (``ktctl load --estimate``'s), asked concurrently, cached."""
        now = time.monotonic()
        out: dict[str, dict[str, Any] | None] = {}

        async def one(alias: str) -> None:
            try:
                reply = await self.state.broker.request(
                    p.Load(alias=alias, dry_run=True), timeout=10.0
                )
            except (Unreachable, ControlError):
                reply = None
            plan = reply.plan if isinstance(reply, p.PlanReply) else {}
            est = plan.get("estimate")
            out[alias] = est if isinstance(est, dict) else None
            self._estimates[alias] = (now, out[alias])

        async with trio.open_nursery() as nursery:
            for alias in aliases:
                hit = self._estimates.get(alias)
                if hit is not None and now - hit[0] < ESTIMATE_TTL:
                    out[alias] = hit[1]
                else:
                    nursery.start_soon(one, alias)
        return out


class _Unread(Exception):
    """The request body could not be read to its end."""


async def _reply(send: Send, status: int, body: bytes, ctype: bytes = _JSON) -> None:
    await respond(send, status, body, [(b"content-type", ctype)])
