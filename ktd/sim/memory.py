"""SGLang's memory API: ``/release_memory_occupation`` and ``/resume_memory_occupation``.

Why these behaviours (upstream 0.5.23 ``entrypoints/http_server.py``,
``managers/io_struct.py``, ``managers/scheduler_components/weight_updater.py``; the kt
fork's ``managers/scheduler_update_weights_mixin.py``; ``docs/sglang.md``, "Sleep"):

* both routes take ``GET`` or ``POST`` with a JSON body ``{"tags": [...]}`` (none or an
  empty list = ``weights``, ``kv_cache``, ``cuda_graph``); a missing body is FastAPI's
  validation error (SGLang answers it 400); done: 200 with body ``null`` (the handler
  returns nothing). Release takes ``KTD_SIM_RELEASE_TIME``, resume ``KTD_SIM_RESUME_TIME``
  (0.05 s each, as measured on the test tier's CPU without the saver).
* the scheduler asserts that nothing runs when it releases; the assertion kills the
  scheduler, and SGLang then kills its whole tree: a release with a request in flight
  takes the server down.
* release adds the tags to the scheduler's offload set and resume removes them
  (``offload_tags.remove``): a resume of a tag that was not released raises in the
  scheduler, which takes the server down too.
* only ``--enable-memory-saver`` makes a release free anything; without it the
  calls succeed and the server keeps serving. With it, a released server still accepts
  generations over HTTP; on a GPU they would run on freed memory. The sim fails each
  one (500, SGLang's error shape) and counts it (``generations_while_released`` in
  ``/get_server_info``), ``/health`` included (it generates a token), so a test can
  prove that ktd never sends one.
* ``KTD_SIM_RESUME_FAIL`` makes a resume answer SGLang's error (400) and stay released;
  ``KTD_SIM_RESUME_HANG`` makes it never answer: ktd's failed or timed-out wake.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from ktd.sim.httpd import Reply, Request
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import log
from ktd.sim.shapes import json_reply, validation_reply
from ktd.sim.state import ServerState

__all__ = ["ALL_TAGS", "GENERATING", "MemoryApi"]

ALL_TAGS = ("weights", "kv_cache", "cuda_graph")

#: Routes that run the model (a forward pass on the GPU), ``/health`` included.
GENERATING = frozenset(
    {
        "/health",
        "/health_generate",
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


class MemoryApi:
    def __init__(
        self, state: ServerState, knobs: Knobs, *, saver: bool, die: Callable[[str], None]
    ) -> None:
        self.state = state
        self.knobs = knobs
        self.saver = saver  # --enable-memory-saver: a release frees the memory
        self._die = die  # the scheduler raised: SGLang takes its tree down
        self.offload_tags: set[str] = set()
        self.generations_while_released = 0

    @property
    def released(self) -> bool:
        """The GPU memory is gone (only ever with the memory saver)."""
        return self.saver and bool(self.offload_tags)

    def info(self) -> dict[str, Any]:
        """What ``/get_server_info`` adds (sim-only fields, for tests)."""
        return {
            "memory_occupation": "released" if self.released else "occupied",
            "released_tags": sorted(self.offload_tags) if self.saver else [],
            "generations_while_released": self.generations_while_released,
        }

    def refuse_generation(self, req: Request) -> Reply | None:
        """A forward pass on a released server: failed and counted."""
        if not self.released or req.path not in GENERATING:
            return None
        self.generations_while_released += 1
        n = self.generations_while_released
        log(f"sim: {req.method} {req.path} while the GPU memory is released ({n} so far)")
        message = "sim: a forward pass reached a server whose GPU memory is released"
        return json_reply({"error": {"message": message}}, 500)

    @staticmethod
    def _tags(req: Request) -> list[str] | Reply:
        if not req.body.strip():
            return validation_reply(
                [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
            )
        try:
            body = json.loads(req.body)
        except ValueError:
            return validation_reply(
                [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error"}]
            )
        tags = body.get("tags") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not (
            tags is None or (isinstance(tags, list) and all(isinstance(t, str) for t in tags))
        ):
            return validation_reply(
                [{"type": "list_type", "loc": ["body", "tags"], "msg": "Input should be a list"}]
            )
        return list(tags) if tags else list(ALL_TAGS)

    async def release(self, req: Request) -> Reply:
        tags = self._tags(req)
        if isinstance(tags, Reply):
            return tags
        if self.state.stats.active:
            self._die(
                "AssertionError: release_memory_occupation should be called only when "
                "server is idle."
            )
            await trio.sleep_forever()  # the server goes down under this request
        await trio.sleep(self.knobs.release_time)
        self.offload_tags.update(tags)
        freed = "freed" if self.saver else "kept (no --enable-memory-saver)"
        log(f"sim: released memory occupation {sorted(tags)}: GPU memory {freed}")
        return json_reply(None)

    async def resume(self, req: Request) -> Reply:
        tags = self._tags(req)
        if isinstance(tags, Reply):
            return tags
        missing = [t for t in tags if t not in self.offload_tags]
        if missing:
            self._die(f"KeyError: {missing[0]!r}")
            await trio.sleep_forever()
        if self.knobs.resume_hang:
            log("sim: KTD_SIM_RESUME_HANG: the resume never answers")
            await trio.sleep_forever()
        await trio.sleep(self.knobs.resume_time)
        if self.knobs.resume_fail:
            log("sim: KTD_SIM_RESUME_FAIL: the resume fails; the memory stays released")
            return json_reply({"error": {"message": "sim: resume_memory_occupation failed"}}, 400)
        self.offload_tags.difference_update(tags)
        log(f"sim: resumed memory occupation {sorted(tags)}")
        return json_reply(None)
