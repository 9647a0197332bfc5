"""Routing and SGLang's native endpoints: health, models, model and server info, stats.

Why these behaviours:

* ``/health`` and ``/health_generate`` answer 503 while starting (before
  warm-up ends) and while draining, as SGLang's do; ``/v1/models`` answers
  200 from the moment the port is bound. ktd's readiness needs both.
* a hang (``KTD_SIM_HANG_AFTER``, SIGUSR1) makes *every* request wait without
  an answer, health included: the case of an engine stuck on the GPU.
* ``--api-key`` is enforced as SGLang's middleware does (``utils/auth.py``,
  ``decide_request_auth``, before any routing): ``OPTIONS`` and paths starting with
  ``/health`` or ``/metrics`` pass (upstream 0.5.23 adds ``/ready``; the kt fork
  0.7.2 does not), everything else needs ``Authorization: Bearer <key>`` (scheme in
  any case) or gets 401 ``{"error": "Unauthorized"}``. The sim's own ``/sim/*``
  routes (no SGLang has them) stay open: tests read an engine's counters there.
* unknown paths and methods answer FastAPI's ``{"detail": ...}`` 404/405; there is
  no ``/get_load`` (SGLang 0.5.23's load route is ``/v1/loads``, loads.py).
* Ollama's API as SGLang serves it (``/api/chat``, ``/api/generate``, ``/api/tags``,
  ``/api/show``, ``GET``/``HEAD /``): ollama.py.
* the memory API (``/release_memory_occupation``, ``/resume_memory_occupation``) and
  what a generation meets on released memory: memory.py.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from ktd.sim import flags, loads, lora, metrics
from ktd.sim.agents import AgentServing
from ktd.sim.api import OpenAIServing
from ktd.sim.cli import SimArgs
from ktd.sim.door import Door
from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import log
from ktd.sim.memory import GENERATING, MemoryApi
from ktd.sim.native import NativeServing
from ktd.sim.ollama import OllamaServing
from ktd.sim.shapes import WEIGHT_VERSION, json_reply, model_card
from ktd.sim.state import DRAINING, UP, ServerState

SIM_VERSION = "0.0.0-sim"

Route = Callable[[HttpRequest], Awaitable[HttpReply]]


def _hf_config(model_path: str) -> dict[str, Any]:
    """``model_type``/``architectures`` from the model's config.json, when there is one."""
    try:
        data = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


#: Routes SGLang marks ``AuthLevel.ADMIN_OPTIONAL`` that the sim serves: with
#: ``--admin-api-key`` set they want that key, and the API key no more (``utils/auth.py``).
ADMIN_OPTIONAL = frozenset(
    {
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/pause_generation",
        "/continue_generation",
        "/flush_cache",
    }
)


class SimApp:
    def __init__(
        self,
        args: SimArgs,
        knobs: Knobs,
        state: ServerState,
        die: Callable[[str, int | None], None] = lambda output, code: None,
    ) -> None:
        self.args = args
        self.knobs = knobs
        self.state = state
        self.scheduler_info: dict[str, Any] = {}
        self.memory = MemoryApi(state, knobs, server_args=args.server_args, die=die)
        self.door = Door(state, knobs)
        self.openai = OpenAIServing(args, knobs, state)
        self.agents = AgentServing(self.openai)
        self.native = NativeServing(self.openai)
        self.ollama = OllamaServing(self.openai)
        self.adapters = lora.adapters(args.server_args)
        self.openai.adapters = self.adapters
        self.openai.lora_on = lora.lora_enabled(args.server_args)
        hf = _hf_config(args.model_path)
        self._model_info = {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path,
            "is_generation": not args.is_embedding,
            "preferred_sampling_params": None,
            "weight_version": WEIGHT_VERSION,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": hf.get("model_type"),
            "architectures": hf.get("architectures"),
        }
        # The paths SGLang's key middleware leaves open, per package.
        self._open_paths: tuple[str, ...] = ("/health", "/metrics")
        if flags.flavor() == "upstream":
            self._open_paths += ("/ready",)
        self.routes: dict[str, dict[str, Route]] = {
            "/health": {"GET": self.health},
            "/health_generate": {"GET": self.health},
            "/v1/models": {"GET": self.models},
            "/model_info": {"GET": self.model_info},
            "/get_model_info": {"GET": self.model_info},
            "/server_info": {"GET": self.server_info},
            "/get_server_info": {"GET": self.server_info},
            "/v1/chat/completions": {"POST": self.openai.chat},
            "/v1/completions": {"POST": self.openai.completions},
            "/v1/embeddings": {"POST": self.openai.embeddings},
            "/v1/responses": {"POST": self.agents.responses},
            "/v1/messages": {"POST": self.agents.messages},
            "/v1/messages/count_tokens": {"POST": self.agents.count_tokens},
            "/generate": {"POST": self.native.generate},
            "/v1/tokenize": {"POST": self.native.tokenize},
            "/v1/detokenize": {"POST": self.native.detokenize},
            "/v1/rerank": {"POST": self.native.rerank},
            "/v1/score": {"POST": self.native.score},
            "/v1/classify": {"POST": self.native.classify},
            "/v1/audio/transcriptions": {"POST": self.native.transcriptions},
            "/api/chat": {"POST": self.ollama.chat},
            "/api/generate": {"POST": self.ollama.generate},
            "/api/tags": {"GET": self.ollama.tags},
            "/api/show": {"POST": self.ollama.show},
            "/": {"GET": self.ollama.root, "HEAD": self.ollama.root},
            "/metrics": {"GET": self.metrics},
            "/v1/loads": {"GET": self.v1_loads},
            "/release_memory_occupation": {"GET": self.memory.release, "POST": self.memory.release},
            "/resume_memory_occupation": {"GET": self.memory.resume, "POST": self.memory.resume},
            "/pause_generation": {"POST": self.door.pause},
            "/continue_generation": {"POST": self.door.cont},
            "/flush_cache": {"GET": self.door.flush, "POST": self.door.flush},
            "/sim/stats": {"GET": self.stats},
            "/sim/gate": {"POST": self.gate},
        }
        if knobs.no_door:  # an SGLang from before the door (KTD_SIM_NO_DOOR)
            del self.routes["/pause_generation"], self.routes["/continue_generation"]

    async def handle(self, req: HttpRequest) -> HttpReply:
        if self.state.hung and not req.path.startswith(("/health", "/v1/models")):
            await self.state.wait_unhung()
        if not self._authorized(req):
            return json_reply({"error": "Unauthorized"}, 401)
        methods = self.routes.get(req.path)
        if methods is None:
            if req.path.startswith("/v1/models/") and req.method == "GET":
                return self.retrieve_model(req.path[len("/v1/models/") :])
            if req.path.startswith("/v1/responses/"):
                rest = req.path[len("/v1/responses/") :]
                if req.method == "GET" and rest and "/" not in rest:
                    return await self.agents.retrieve(req, rest)
                if req.method == "POST" and rest.endswith("/cancel") and rest.count("/") == 1:
                    return await self.agents.cancel(req, rest.split("/", 1)[0])
            return json_reply({"detail": "Not Found"}, 404)
        route = methods.get(req.method)
        if route is None:
            reply = json_reply({"detail": "Method Not Allowed"}, 405)
            reply.headers.append(("allow", ", ".join(methods)))
            return reply
        if req.path in GENERATING:
            await self.door.wait_open()  # the tokenizer holds it while paused
        refused = await self.memory.admit(req)
        if refused is not None:
            return refused
        return await route(req)

    def _authorized(self, req: HttpRequest) -> bool:
        """SGLang's ``decide_request_auth``: the admin-level routes want the admin key
        when one is set (else the API key), every other route the API key; health,
        readiness and metrics stay open."""
        if req.method == "OPTIONS" or req.path.startswith((*self._open_paths, "/sim/")):
            return True
        admin = self.args.server_args.get("admin_api_key")
        key = admin if admin and req.path in ADMIN_OPTIONAL else self.args.api_key
        if not key:
            return True
        scheme, _, token = (req.headers.get("authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), key.encode())

    async def health(self, req: HttpRequest) -> HttpReply:
        """SGLang's ``/health`` is a one-token generation through the scheduler: it costs a
        token's time, and a scheduler that gives no output answers 503 after
        ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) while the HTTP server itself stays up.
        Its token is a request the scheduler runs (a release meanwhile asserts), and on
        released GPU memory it fails (memory.py)."""
        if self.state.status == DRAINING:
            log("Health check request received during shutdown. Returning 503.")
            return HttpReply(503, content_type=None)
        if self.knobs.never_healthy or self.state.status != UP:
            return HttpReply(503, content_type=None)
        self.state.drain_handler = True
        with trio.move_on_after(self.knobs.health_timeout):
            await self.state.wait_unhung()
            await self.door.wait_open()  # its token waits at a closed door like any other
            if await self.memory.health_refused(req):
                return HttpReply(503, content_type=None)
            self.state.health_active += 1
            try:
                await trio.sleep(self.knobs.token_time())
                self.state.publish()  # its prefill ended: the scheduler publishes
            finally:
                self.state.health_active -= 1
                if not self.state.in_scheduler():
                    self.state.publish()
            return HttpReply(200, content_type=None)
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.knobs.health_timeout:g} seconds.")  # fmt: skip
        return HttpReply(503, content_type=None)

    def _card(self) -> dict[str, Any]:
        a = self.args
        return model_card(a.served_model_name, a.model_path, int(time.time()), a.context_length)

    def _adapter_cards(self) -> list[dict[str, Any]]:
        """SGLang lists each loaded LoRA adapter under its own name, parented to the base."""
        created = int(time.time())
        cards = []
        for name, path in self.adapters.items():
            card = model_card(name, path, created, 0)
            card["parent"] = self.args.served_model_name
            card["max_model_len"] = None
            cards.append(card)
        return cards

    async def models(self, req: HttpRequest) -> HttpReply:
        return json_reply({"object": "list", "data": [self._card(), *self._adapter_cards()]})

    async def metrics(self, req: HttpRequest) -> HttpReply:
        if not self.args.server_args.get("enable_metrics"):
            return json_reply({"detail": "Not Found"}, 404)
        body = metrics.render(self.args.served_model_name, self.state)
        return HttpReply(200, body, metrics.CONTENT_TYPE)

    def retrieve_model(self, model: str) -> HttpReply:
        for card in self._adapter_cards():
            if card["id"] == model:
                return json_reply(card)
        if model != self.args.served_model_name:
            err = {
                "message": f"The model '{model}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            return json_reply({"error": err}, 404)
        return json_reply(self._card())

    async def model_info(self, req: HttpRequest) -> HttpReply:
        return json_reply(self._model_info)

    async def server_info(self, req: HttpRequest) -> HttpReply:
        info: dict[str, Any] = dict(self.args.server_args)
        info.update(self.scheduler_info)
        info["internal_states"] = [{"last_gen_throughput": 0.0, "status": self.state.status}]
        info["version"] = SIM_VERSION
        info.update(self.memory.info())
        info.update(self.door.info())
        return json_reply(info)

    async def v1_loads(self, req: HttpRequest) -> HttpReply:
        """SGLang's per-DP-rank load: upstream's published snapshot, which a request is in
        only from the end of its prefill on; the fork's count, asked between batches."""
        sa = self.args.server_args
        upstream = flags.flavor() == "upstream"
        running, tokens, taken = self.state.snapshot if upstream else self.state.live_load()
        load = loads.snapshot(
            running=running,
            used_tokens=tokens,
            taken=taken,
            max_total_tokens=int(sa.get("max_total_tokens") or self.args.context_length),
            max_running=int(sa.get("max_running_requests") or 2048),
        )
        return loads.reply(req, load, SIM_VERSION)

    async def stats(self, req: HttpRequest) -> HttpReply:
        return json_reply(self.state.stats.as_dict())

    async def gate(self, req: HttpRequest) -> HttpReply:
        """The test's gate (``KTD_SIM_HOLD``): ``{"open": true}`` lets every held
        generation go on, ``false`` holds the next tokens again. Not SGLang's: ``/sim/``."""
        try:
            open_ = json.loads(req.body or b"{}")["open"]
        except (ValueError, KeyError, TypeError):
            open_ = None
        if not isinstance(open_, bool):
            return json_reply({"detail": 'expected {"open": true|false}'}, 400)
        self.state.set_gate(open_)
        return json_reply({"open": open_})
