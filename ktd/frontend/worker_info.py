"""What sglang-router reads from a worker, answered by the frontend (gateway ``frontend`` mode).

Registered as a worker, the frontend is polled like an SGLang server: the
router's add job reads ``/server_info`` and ``/model_info`` (older routers:
``/get_server_info``, ``/get_model_info``), health-checks ``/health`` (app.py's
route: 200 while the daemon answers) and samples ``/get_load``, which the frontend
sums from its engines' ``/v1/loads`` (SGLang 0.5.23 has no ``/get_load`` itself). Answers use
SGLang's own shapes for the engines the frontend fronts: a ready engine's own
answer passed through when there is one (nothing to imitate), else one built
from the config, so a model that is not loaded yet still registers and loads on
demand when the first request arrives.

A key scoped to some models (``frontend.keys``' ``models``) sees only those here too:
``X-Ktd-Model`` naming another is a 403 (``model_not_allowed``), and the engine or model
chosen, and the engines ``/get_load`` sums, are the key's own (issue 43).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quart import Response, request

from ktd import __version__, foreign
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.keys import Policy
from ktd.frontend import errors
from ktd.frontend.inbound import header
from ktd.frontend.routes import MODEL_HEADER
from ktd.frontend.upstream import UpstreamError

if TYPE_CHECKING:
    from ktd.frontend.state import State

_JSON = "application/json"
_IDLE_LOAD = {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}


def model_info_shape(path: str) -> dict[str, Any]:
    """SGLang's ``/model_info`` for a model that is not loaded (pure)."""
    return {
        "model_path": path,
        "tokenizer_path": path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }


def server_info_shape(alias: str, path: str, *, status: str) -> dict[str, Any]:
    """SGLang's ``/server_info`` (server args + scheduler state + version), from config."""
    return {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": alias,
        "dp_size": 1,
        "tp_size": 1,
        "is_embedding": False,
        "internal_states": [{"last_gen_throughput": 0.0, "status": status}],
        "version": f"ktd-{__version__}",
    }


#: Fields of SGLang's ``/server_info`` (its server args) that hold its keys.
_KEY_FIELDS = ("api_key", "admin_api_key")


def without_keys(info: Any) -> Any:
    """An engine's ``/server_info`` without its keys (pure): SGLang lists every server
    arg, ``api_key`` among them, and the frontend's clients must never see the key
    ktd gave the engine."""
    if isinstance(info, dict):
        return {k: (None if k in _KEY_FIELDS and v is not None else v) for k, v in info.items()}
    return info


def sum_loads(per_engine: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """sglang-router's ``/get_load`` from the engines' ``/v1/loads`` entries, rank by rank (pure).

    SGLang 0.5.23 has only ``/v1/loads`` (``num_running_reqs``, ``num_waiting_reqs``,
    ``num_used_tokens`` per DP rank); the router (0.3.2) still asks a worker for the
    older ``/get_load`` list, where ``num_reqs`` counted running and waiting requests
    and ``num_tokens`` the tokens in use.
    """
    by_rank: dict[int, dict[str, Any]] = {}
    for loads in per_engine:
        for entry in loads:
            rank = int(entry.get("dp_rank", 0) or 0)
            acc = by_rank.setdefault(rank, {**_IDLE_LOAD, "dp_rank": rank})
            running = int(entry.get("num_running_reqs", 0) or 0)
            waiting = int(entry.get("num_waiting_reqs", 0) or 0)
            acc["num_reqs"] += running + waiting
            acc["num_waiting_reqs"] += waiting
            acc["num_tokens"] += int(entry.get("num_used_tokens", 0) or 0)
    return [by_rank[r] for r in sorted(by_rank)] or [dict(_IDLE_LOAD)]


def views(state: State) -> dict[str, Callable[..., Any]]:
    """The worker-info views, by routes.py endpoint (Quart serves them)."""
    info = WorkerInfo(state)
    return {
        "server_info": info.server_info,
        "get_server_info": info.server_info,
        "model_info": info.model_info,
        "get_model_info": info.model_info,
        "get_load": info.get_load,
    }


class WorkerInfo:
    """The frontend's answers to what sglang-router asks a worker."""

    def __init__(self, state: State) -> None:
        self.state = state

    async def server_info(self) -> Response:
        return await self._from_engine_or_config(
            "/server_info", lambda a, path, st: server_info_shape(a, path, status=st)
        )

    async def model_info(self) -> Response:
        return await self._from_engine_or_config(
            "/model_info", lambda a, path, st: model_info_shape(path)
        )

    async def get_load(self) -> Response:
        """The ready engines' ``/v1/loads`` (the key's), summed per DP rank (one engine
        that fails to answer is left out)."""
        ready, _ = await self._fronted(self._policy())
        loads: list[list[dict[str, Any]]] = []
        for e in ready:
            try:
                got = await self._engine_json(e.url or "", "/v1/loads?include=core")
            except (UpstreamError, ValueError, OSError):
                continue
            entries = got.get("loads") if isinstance(got, dict) else None
            if isinstance(entries, list):
                loads.append([x for x in entries if isinstance(x, dict)])
        return _reply(sum_loads(loads))

    async def _from_engine_or_config(self, path: str, build: Any) -> Response:
        """A ready engine's own answer at ``path`` (the one ``X-Ktd-Model`` names, when it
        does), else one built from the config."""
        policy = self._policy()
        named = _named(request.scope)
        if named is not None and policy is not None and not policy.allows(named):
            raise errors.make("model_forbidden", key=policy.name, model=named)
        ready, models = await self._fronted(policy)
        if named is not None:
            ready = [e for e in ready if e.alias == named]
            models = [m for m in models if m.alias == named] or models
        if ready:
            try:
                return _reply(await self._engine_json(ready[0].url or "", path))
            except (UpstreamError, ValueError, OSError):
                pass  # going away as we asked: describe it from the config
        if not models:
            return _reply(build("ktd", "", "no model"))
        m = next((m for m in models if any(e.alias == m.alias for e in ready)), models[0])
        return _reply(build(m.alias, m.path, m.state))

    def _policy(self) -> Policy | None:
        """The request's key (401 without a good one, keys set; None: no keys)."""
        return self.state.keys.of(request.scope)

    async def _fronted(self, policy: Policy | None) -> tuple[list[p.EngineInfo], list[p.ModelInfo]]:
        """The ready engines (with a URL) and the served models, from the daemon: those
        ``policy``'s key may use."""
        broker = self.state.broker
        try:
            status = await broker.request(p.Status())
            models = await broker.request(p.Models())
        except (Unreachable, ControlError) as exc:
            raise errors.make("daemon_unreachable", detail=str(exc)) from None
        if not isinstance(status, p.StatusReply) or not isinstance(models, p.ModelsReply):
            raise errors.make("daemon_unreachable", detail="unexpected reply from the daemon")
        allows = (lambda alias: True) if policy is None else policy.allows
        ready = [e for e in status.engines if e.state == S.READY and e.url and allows(e.alias)]
        return ready, [m for m in models.models if m.served and allows(m.alias)]

    async def _engine_json(self, url: str, path: str) -> Any:
        resp = await self.state.upstream.request(url, path.encode(), [], b"", method=b"GET")
        try:
            body = await resp.read()
        finally:
            resp.close()
        if resp.status != 200:
            raise UpstreamError(f"{path}: HTTP {resp.status}")
        return without_keys(foreign.loads(body))


def _named(scope: Any) -> str | None:
    """The model ``X-Ktd-Model`` names, if it names one."""
    value = header(scope, MODEL_HEADER)
    text = value.strip().decode("utf-8", "replace") if value is not None else ""
    return text or None


def _reply(obj: Any) -> Response:
    return Response(errors._encoder.encode(obj), status=200, content_type=_JSON)
