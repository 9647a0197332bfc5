"""SGLang's memory API: ``/release_memory_occupation`` and ``/resume_memory_occupation``.

Why: ktd puts an idle engine to sleep by releasing its GPU memory and wakes it by
resuming it, and must never let a generation reach it in between. The sim plays the
calls as the installed SGLang answers them, so ktd's tests see the same answers, the
same deaths, and (the point of the sim) can count what a real GPU would have run on
freed memory. Sources: upstream 0.5.23 ``entrypoints/http_server.py`` (the routes),
``managers/io_struct.py`` (the bodies), ``managers/scheduler_components/
weight_updater.py`` (the scheduler's side); the kt fork 0.7.2's
``managers/scheduler_update_weights_mixin.py``; ``torch_memory_saver``'s
``csrc/core.cpp``; ``docs/sglang.md``, "Sleep".

* Both routes take ``GET`` or ``POST`` with a required JSON object body ``{"tags":
  [...]}`` (null or ``[]`` = all of ``kv_cache``, ``weights``, ``cuda_graph``; other
  fields are ignored). A missing body, one that is not an object, or a body sent
  without a JSON content type is FastAPI's validation error, which SGLang answers 400
  (errors listed as each flavor's pydantic reports them; see ``parse_tags``). Done:
  200, body ``null`` (the handler returns nothing). A release takes
  ``KTD_SIM_RELEASE_TIME``, a resume ``KTD_SIM_RESUME_TIME`` (0.05 s each by default,
  to keep ktd's suite fast; measured on the test tier's CPU server: 0.4 s and 0.02 s).
  The scheduler finishes a call even when the client hangs up: a timed-out release
  may still have released.
* The scheduler runs one thing at a time: a generation or ``/health`` that arrives
  during a release or a resume waits for it, then meets the memory as the call left
  it. A release asserts that nothing runs (upstream: "... only when server is idle.",
  the fork: "... only when no ongoing request."), ``/health``'s own token included;
  the assertion kills the scheduler and SGLang kills its tree: a release with a
  request in flight takes the server down (exit -9).
* Release adds the tags to the scheduler's ``offload_tags``; resume removes them with
  ``set.remove``: a resume of a tag that is not released (never released, already
  resumed, named twice) raises ``KeyError`` in the scheduler, which takes the server
  down too. Both hold with or without the saver.
* Only ``--enable-memory-saver`` frees anything; without it both calls succeed and
  the server keeps serving. With it, releasing a tag that is already released makes
  ``torch_memory_saver`` ``exit(1)`` in the scheduler ("Cannot pause allocation that
  is not active"): upstream's subprocess watchdog then takes the server down, the
  fork has no watchdog and is left with no scheduler (every generation hangs,
  ``/health`` fails after its timeout). ``cuda_graph`` has no memory to pause under
  ``--disable-cuda-graph``. Without ``--enable-weights-cpu-backup`` resumed weights
  come back as uninitialised memory: the sim reports it (``weights_intact``).
* While released, SGLang still accepts generations over HTTP; on a GPU they would run
  on unmapped memory (a CUDA illegal address: the scheduler dies, or at best an
  error). The sim fails each one at once with the error SGLang's route answers an
  internal failure with (OpenAI routes: 500 ``InternalServerError``; Anthropic: 500
  ``api_error``; ``/generate`` and Ollama: uvicorn's bare 500; ``/health*``: 503, its
  failure status) and counts it, valid or not: ktd must send none at all. Routes that
  do not run the model (models, infos, loads, metrics, tokenize...) keep answering.
* ``KTD_SIM_RESUME_FAIL``: a resume answers SGLang's error (400 ``{"error":
  {"message"}}``, ``_create_error_response``) and the memory stays released (the
  tags too, so a retry is no ``KeyError``; it fails alike while the knob is set).
  ``KTD_SIM_RESUME_HANG``: the scheduler gets stuck in the resume; the call never
  answers, nor does any generation or ``/health`` after it (the inspection routes
  still do, so a test can look).

``/get_server_info`` adds sim-only fields (``info``): ``memory_occupation``
(``occupied``, ``releasing``, ``released``, ``resuming``), ``released_tags`` (memory
actually freed), ``offload_tags`` (the scheduler's set), ``generations_while_released``
and ``weights_intact``; the same go into ``KTD_SIM_RECORD`` at each change.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from ktd.sim import flags
from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import log
from ktd.sim.shapes import anthropic_error, error_reply, json_reply, validation_reply
from ktd.sim.state import ServerState
from ktd.sim.validate import json_invalid

__all__ = ["ALL_TAGS", "GENERATING", "HEALTH", "MemoryApi", "parse_tags"]

_TRUE = {"1", "true"}  # SGLang's get_bool_env_var, where its graph runners capture

# SGLang's GPU_MEMORY_ALL_TYPES, in its order (the order a resume removes them in).
ALL_TAGS = ("kv_cache", "weights", "cuda_graph")

#: Routes that run the model (a forward pass on the GPU), apart from the health checks.
GENERATING = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/generate",
        "/v1/rerank",
        "/v1/score",
        "/v1/classify",
        "/v1/audio/transcriptions",
        "/api/chat",
        "/api/generate",
    }
)
#: SGLang's ``/health`` and ``/health_generate`` generate one token each.
HEALTH = frozenset({"/health", "/health_generate"})

_CLASS = {"release": "ReleaseMemoryOccupationReqInput", "resume": "ResumeMemoryOccupationReqInput"}
# Where the scheduler raises, per flavor: (file, line and code of the assert, line of
# the remove).
_WHERE = {
    "upstream": (
        "sglang/srt/managers/scheduler_components/weight_updater.py",
        339,
        "assert self.is_fully_idle(",
        390,
    ),
    "kt": ("sglang/srt/managers/scheduler_update_weights_mixin.py", 124, "assert (", 163),
}
_IDLE_ASSERT = {
    "upstream": "release_memory_occupation should be called only when server is idle.",
    "kt": "release_memory_occupation should be called only when no ongoing request.",
}
_CUDA_ERROR = "CUDA error: an illegal memory access was encountered"
_decode = msgspec.json.Decoder().decode


def _is_json(req: HttpRequest) -> bool:
    """FastAPI parses a body as JSON only for ``application/json`` or ``application/*+json``."""
    ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    main, _, sub = ctype.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def parse_tags(
    req: HttpRequest, call: str, which: str | None = None
) -> list[str] | HttpReply | None:
    """The body's ``tags`` (None: absent or null), or the 400 SGLang answers.

    The body is FastAPI's required body parameter: upstream 0.5.23 declares it as a
    msgspec struct behind a pydantic schema (``is-instance`` then ``function-after``
    branches, two errors), the fork as a dataclass (one error). ``rid`` and
    ``http_worker_ipc`` are not checked."""
    which = which or flags.flavor()
    cls = _CLASS[call]
    upstream = which == "upstream"
    after = f"function-after[build_struct(), {cls}]"
    if not req.body:
        return validation_reply(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    body: Any = req.body  # FastAPI hands the raw bytes on when it is not JSON
    if _is_json(req):
        try:
            body = _decode(req.body)
        except msgspec.DecodeError:
            return validation_reply([json_invalid(req.body)])

    def failed(*errors: dict[str, Any]) -> HttpReply:
        if not upstream:
            return validation_reply(list(errors))
        first = {
            "type": "is_instance_of",
            "loc": ("body", f"is-instance[{cls}]"),
            "msg": f"Input should be an instance of {cls}",
            "input": body,
            "ctx": {"class": cls},
        }
        return validation_reply([first, *errors])

    if not isinstance(body, dict):
        if upstream:
            return failed(
                {
                    "type": "dict_type",
                    "loc": ("body", after),
                    "msg": "Input should be a valid dictionary",
                    "input": body,
                }
            )
        return failed(
            {
                "type": "dataclass_type",
                "loc": ("body",),
                "msg": f"Input should be a dictionary or an instance of {cls}",
                "input": body,
                "ctx": {"class_name": cls},
            }
        )
    tags = body.get("tags")
    loc: tuple[str, ...] = ("body", after, "tags") if upstream else ("body", "tags")
    if tags is None:
        return None
    if not isinstance(tags, list):
        msg = "Input should be a valid list"
        return failed({"type": "list_type", "loc": loc, "msg": msg, "input": tags})
    msg = "Input should be a valid string"
    bad = [
        {"type": "string_type", "loc": (*loc, i), "msg": msg, "input": t}
        for i, t in enumerate(tags)
        if not isinstance(t, str)
    ]
    if bad:
        return failed(*bad)
    return list(tags)


def _refusal(path: str) -> HttpReply:
    """What a generation on released memory gets: the error each route family answers an
    internal failure with (see the module docstring)."""
    if path in ("/generate", "/api/chat", "/api/generate"):
        return HttpReply(500, b"Internal Server Error", "text/plain; charset=utf-8")
    if path == "/v1/messages":
        return anthropic_error("Internal server error", "api_error", 500)
    return error_reply(f"Internal server error: {_CUDA_ERROR}", "InternalServerError", 500)


class MemoryApi:
    """The scheduler's memory state and the two routes that change it."""

    def __init__(
        self,
        state: ServerState,
        knobs: Knobs,
        *,
        server_args: Mapping[str, Any],
        die: Callable[[str, int | None], None],
    ) -> None:
        self.state = state
        self.knobs = knobs
        self.flavor = flags.flavor()
        self.saver = bool(server_args.get("enable_memory_saver"))
        self.cpu_backup = bool(server_args.get("enable_weights_cpu_backup"))
        # The tags that own GPU memory to pause: CUDA graphs only when they were
        # captured under the saver (SGLANG_MEMORY_SAVER_CUDA_GRAPH; else released
        # "cuda_graph" frees nothing), and never without graphs.
        in_saver = os.environ.get("SGLANG_MEMORY_SAVER_CUDA_GRAPH", "").lower() in _TRUE
        no_graphs = server_args.get("disable_cuda_graph") or not in_saver
        graphs = () if no_graphs else ("cuda_graph",)
        self.allocated = frozenset(("kv_cache", "weights", *graphs))
        # ``die(scheduler_output, exit_code)``: the scheduler raised (exit_code None:
        # its ``except`` SIGQUITs the server) or exited at once (exit_code 1).
        self._die = die
        self.on_change: Callable[[dict[str, Any]], None] | None = None  # KTD_SIM_RECORD
        self.offload_tags: set[str] = set()
        self.generations_while_released = 0
        self.weights_intact = True
        self.phase: str | None = None  # "releasing" / "resuming" while a call runs
        self._lock = trio.Lock()  # one call at a time, as the scheduler's loop runs them
        self._settled = trio.Event()
        self._settled.set()
        self._stuck = False  # KTD_SIM_RESUME_HANG: the scheduler never comes back

    # -- state
    @property
    def released_tags(self) -> list[str]:
        """The tags whose GPU memory is actually freed (none without the saver)."""
        if not self.saver:
            return []
        return [t for t in ALL_TAGS if t in self.offload_tags and t in self.allocated]

    @property
    def released(self) -> bool:
        return bool(self.released_tags)

    def info(self) -> dict[str, Any]:
        """What ``/get_server_info`` adds (sim-only fields, for tests)."""
        return {
            "memory_occupation": self.phase or ("released" if self.released else "occupied"),
            "released_tags": self.released_tags,
            "offload_tags": sorted(self.offload_tags),
            "generations_while_released": self.generations_while_released,
            "weights_intact": self.weights_intact,
        }

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.info())

    async def settled(self) -> None:
        """Returns once no release or resume is running (never, after a hung resume)."""
        while self.phase is not None:
            await self._settled.wait()

    @asynccontextmanager
    async def _call(self, phase: str) -> AsyncIterator[None]:
        async with self._lock:
            if self._stuck:
                await trio.sleep_forever()  # queued behind the hung resume
            self.phase = phase
            self._settled = trio.Event()
            self._changed()
            try:
                yield
            finally:
                if not self._stuck:
                    self.phase = None
                    self._settled.set()
                    self._changed()

    # -- generations
    def _count(self, req: HttpRequest) -> None:
        self.generations_while_released += 1
        n = self.generations_while_released
        log(f"sim: {req.method} {req.path} reached released GPU memory ({n} so far): failed")
        self._changed()

    async def admit(self, req: HttpRequest) -> HttpReply | None:
        """Gate a generating route: wait out a running call, then fail and count a
        generation on released memory. None: go ahead."""
        if req.path not in GENERATING:
            return None
        await self.settled()
        if not self.released:
            return None
        self._count(req)
        return _refusal(req.path)

    async def health_refused(self, req: HttpRequest) -> bool:
        """The same gate for ``/health``'s one token: True when it is failed (503)."""
        await self.settled()
        if not self.released:
            return False
        self._count(req)
        return True

    # -- the routes
    def _traceback(self, line: int, func: str, code: str, error: str) -> str:
        path = _WHERE[self.flavor][0]
        return (
            "Traceback (most recent call last):\n"
            f'  File "{path}", line {line}, in {func}\n'
            f"    {code}\n{error}\n"
        )

    async def _die_under(self, output: str, exit_code: int | None) -> None:
        """The scheduler dies; this request never gets an answer."""
        self._die(output, exit_code)
        await trio.sleep_forever()

    def _todo(self, req: HttpRequest, call: str) -> list[str] | HttpReply:
        """The tags a release or a resume acts on: the body's, every tag when it names
        none (SGLang's default), or the 400 it answers."""
        tags = parse_tags(req, call, self.flavor)
        return tags if isinstance(tags, HttpReply) else (tags or list(ALL_TAGS))

    async def release(self, req: HttpRequest) -> HttpReply:
        todo = self._todo(req, "release")
        if isinstance(todo, HttpReply):
            return todo
        async with self._call("releasing"):
            if self.state.stats.active or self.state.health_active:
                _, line, code, _ = _WHERE[self.flavor]
                error = f"AssertionError: {_IDLE_ASSERT[self.flavor]}"
                tb = self._traceback(line, "release_memory_occupation", code, error)
                await self._die_under(tb, None)
            # torch_memory_saver pauses kv_cache, then weights, then cuda_graph.
            again = [t for t in ALL_TAGS if t in todo and t in self.released_tags]
            if again:
                await self._die_under(
                    "[torch_memory_saver.cpp] Cannot pause allocation that is not active. "
                    f"tag={again[0]} file=csrc/core.cpp func=pause",
                    1,
                )
            with trio.CancelScope(shield=True):  # the scheduler finishes it regardless
                await trio.sleep(self.knobs.release_time)
                self.offload_tags.update(todo)
            what = "freed" if self.saver else "kept: no --enable-memory-saver"
            log(f"sim: release_memory_occupation tags={todo}: GPU memory {what}")
        return json_reply(None)

    async def resume(self, req: HttpRequest) -> HttpReply:
        todo = self._todo(req, "resume")
        if isinstance(todo, HttpReply):
            return todo
        async with self._call("resuming"):
            left = set(self.offload_tags)
            for tag in todo:  # SGLang's ``self.offload_tags.remove(tag)``
                if tag not in left:
                    line = _WHERE[self.flavor][3]
                    tb = self._traceback(
                        line, "resume_memory_occupation", "self.offload_tags.remove(tag)",
                        f"KeyError: {tag!r}",
                    )  # fmt: skip
                    await self._die_under(tb, None)
                left.remove(tag)
            if self.knobs.resume_hang:
                self._stuck = True
                log("sim: KTD_SIM_RESUME_HANG: the scheduler is stuck in the resume")
                await trio.sleep_forever()
            with trio.CancelScope(shield=True):
                await trio.sleep(self.knobs.resume_time)
                if not self.knobs.resume_fail:
                    paused = self.released_tags
                    self.offload_tags = left
                    if "weights" in paused and "weights" in todo and not self.cpu_backup:
                        self.weights_intact = False
            if self.knobs.resume_fail:
                log("sim: KTD_SIM_RESUME_FAIL: the resume fails; the memory stays released")
                message = (
                    "Failed to resume memory occupation: CUDA error: out of memory "
                    "(simulated: KTD_SIM_RESUME_FAIL)"
                )
                return json_reply({"error": {"message": message}}, 400)
            log(f"sim: resume_memory_occupation tags={todo}: GPU memory back")
            if not self.weights_intact:
                log("sim: the weights were resumed without --enable-weights-cpu-backup: "
                    "their GPU memory is uninitialised")  # fmt: skip
        return json_reply(None)
