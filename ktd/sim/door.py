"""SGLang's door: ``/pause_generation``, ``/continue_generation`` and ``/flush_cache``.

Why: ktd fences an engine before it releases its GPU memory (``docs/sglang.md``,
"Sleep"): it closes this door so that nothing new reaches the scheduler, and asks the
scheduler to prove itself idle. The sim answers as both packages do (upstream 0.5.23
``entrypoints/http_server.py``, ``managers/tokenizer_manager.py``,
``managers/scheduler.py``; the kt fork 0.7.2 the same files), so ktd's tests meet the
same door:

* ``POST /pause_generation``, body ``{"mode": "abort" | "retract" | "in_place"}``
  (default ``abort``; a missing or non-object body is FastAPI's 400). Every mode sets the
  tokenizer manager's ``is_pause``: a generation that arrives then waits before it is
  tokenized, ``/health``'s token too (which answers 503 after its
  ``SGLANG_HEALTH_CHECK_TIMEOUT``). ``abort`` stays in the tokenizer manager: it aborts
  everything in flight (``abort_all``) once a second until no request is left, then
  answers. ``retract`` and ``in_place`` pause the scheduler itself, whose event loop then
  turns without sleeping for as long as the pause lasts (a core spent: the sim reports
  ``scheduler_spinning``). Answer: 200 ``{"message": "Generation paused
  successfully.", "status": "ok"}``.
* ``POST /continue_generation`` (body required, ``{}`` will do): the door opens, who
  waited goes on. A generation let through onto released GPU memory is what the sim
  counts (memory.py).
* ``GET``/``POST /flush_cache``: answered by the scheduler in order: 200 ``Cache
  flushed.`` when nothing runs (upstream: nor waits), else 400 with the same text's
  failure. No content type (Starlette's bare ``Response``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from ktd.sim import flags
from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import log
from ktd.sim.shapes import json_reply, validation_reply
from ktd.sim.state import ServerState
from ktd.sim.validate import json_invalid

__all__ = ["Door"]

MODES = ("abort", "retract", "in_place")
_FLUSHED = (
    b"Cache flushed.\nPlease check backend logs for more details. "
    b"(When there are running or waiting requests, the operation will not be performed.)\n"
)
_decode = msgspec.json.Decoder().decode


def _body(req: HttpRequest) -> dict[str, Any] | HttpReply:
    """The required JSON object body of both routes, or FastAPI's 400."""
    if not req.body:
        return validation_reply(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        body = _decode(req.body)
    except msgspec.DecodeError:
        return validation_reply([json_invalid(req.body)])
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary"
        err = {"type": "dict_type", "loc": ("body",), "msg": msg, "input": body}
        return validation_reply([err])
    return body


class Door:
    """The tokenizer manager's ``is_pause`` and the scheduler's own pause."""

    def __init__(self, state: ServerState, knobs: Knobs) -> None:
        self.state = state
        self.knobs = knobs
        self.closed = False
        self.scheduler_paused = False  # retract / in_place: its loop spins meanwhile
        self.waiting = 0  # generations held at the door now
        self._open = trio.Event()
        self._open.set()

    def info(self) -> dict[str, Any]:
        return {
            "door": "closed" if self.closed else "open",
            "held_at_door": self.waiting,
            "scheduler_spinning": self.scheduler_paused,
        }

    async def wait_open(self) -> None:
        """Where a generation waits while the door is closed, before the scheduler."""
        if not self.closed:
            return
        self.waiting += 1
        try:
            while self.closed:
                await self._open.wait()
        finally:
            self.waiting -= 1

    async def pause(self, req: HttpRequest) -> HttpReply:
        body = _body(req)
        if isinstance(body, HttpReply):
            return body
        mode = body.get("mode", "abort")
        if mode not in MODES:
            err = {
                "type": "literal_error",
                "loc": ("body", "mode"),
                "msg": "Input should be 'abort', 'retract' or 'in_place'",
                "input": mode,
                "ctx": {"expected": "'abort', 'retract' or 'in_place'"},
            }
            return validation_reply([err])
        self.closed = True
        self._open = trio.Event()
        if mode == "abort":
            while True:  # the tokenizer manager's loop: abort all, until none is left
                self.state.abort_all()
                if not self.state.stats.active:
                    break
                await trio.sleep(1.0)
        else:
            self.scheduler_paused = True
            log(f"sim: pause_generation mode={mode}: the scheduler loop spins while paused")
        log(f"sim: pause_generation mode={mode}: new requests wait at the door")
        return json_reply({"message": "Generation paused successfully.", "status": "ok"})

    async def cont(self, req: HttpRequest) -> HttpReply:
        body = _body(req)
        if isinstance(body, HttpReply):
            return body
        self.closed = self.scheduler_paused = False
        self._open.set()
        log("sim: continue_generation: the door is open")
        return json_reply({"message": "Generation continued successfully.", "status": "ok"})

    async def flush(self, req: HttpRequest) -> HttpReply:
        if self.state.in_scheduler():
            n = self.state.in_scheduler()
            log(f"Cache not flushed because there are pending requests. #running-req: {n}")
            # Upstream answers its own failure text; the fork the success text, with 400.
            failed = b"Flush cache failed.\n" if flags.flavor() == "upstream" else _FLUSHED
            return HttpReply(400, failed, None)
        log("Cache flushed successfully!")
        return HttpReply(200, _FLUSHED, None)
