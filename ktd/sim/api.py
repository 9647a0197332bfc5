"""``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` as SGLang answers them.

Why the order of checks matters: SGLang rejects a malformed request (wrong
content type, bad JSON, a field of the wrong type) and a ``model`` naming a
LoRA adapter (``name:adapter``) before anything starts, so those are plain
400 replies even for ``stream: true``. The context-length check happens in
the tokenizer manager, which a streaming reply reaches only after its 200
status and headers are out: there the error is an SSE event.

Every generation request is counted in ``/sim/stats``; ``finish`` runs once
per request however it ends, and a client that goes away is logged as
``sim: request <rid> aborted by client``. Unknown JSON fields are ignored.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from ktd.sim import gen
from ktd.sim.cli import SimArgs
from ktd.sim.httpd import SSE, HttpReply, HttpRequest
from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import log
from ktd.sim.shapes import (
    DONE,
    NOT_EMBEDDING,
    chat_choice,
    chat_chunk,
    chat_response,
    completion_obj,
    delta_choice,
    embedding_response,
    error_reply,
    field_error,
    json_reply,
    sse,
    text_choice,
    usage,
    validation_reply,
)
from ktd.sim.state import Aborted, ServerState
from ktd.sim.validate import Fields, items_of, parse_body

#: Seconds of one prefill chunk (``--chunked-prefill-size`` worth of a long prompt).
PREFILL_CHUNK = 0.5


class Pacer:
    """Token timing: ``KTD_SIM_PREFILL_TIME`` before the first token (a long kt prefill:
    the request is in no load snapshot meanwhile), then ``KTD_SIM_TOKEN_RATE`` tokens/s;
    a hang stops the tokens too, and so does the test's closed gate (``KTD_SIM_HOLD``)
    after the first token. A request begun before an ``abort_all`` (the pause route's
    abort mode) raises ``Aborted`` at its next step."""

    def __init__(self, knobs: Knobs, state: ServerState) -> None:
        rate = knobs.token_rate
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.prefill = knobs.prefill_time
        self.state = state
        self.next = 0.0
        self.epoch = state.abort_epoch
        self.first = True

    def check(self) -> None:
        if self.state.abort_epoch != self.epoch:
            raise Aborted

    async def tick(self) -> None:
        self.check()
        if self.state.hung:
            await self.state.wait_unhung()
        if not self.first:
            await self.state.wait_gate()
            self.check()
        self.first = False
        while self.prefill > 0:  # chunked prefill: an abort lands between two chunks
            chunk = min(self.prefill, PREFILL_CHUNK)
            await trio.sleep(chunk)
            self.prefill -= chunk
            self.check()
        if self.interval:
            now = trio.current_time()
            self.next = max(self.next + self.interval, now) if self.next else now + self.interval
            await trio.sleep_until(self.next)
            self.check()


@dataclass(frozen=True)
class Streamed:
    """A streamed answer's makings, the same for chat and completions: the request's id,
    model and plan, its prompt's tokens, whether a usage chunk ends it, and when the
    request began (its time to first token counts from then)."""

    rid: str
    model: str
    plan: gen.ChoicePlan
    prompt_tokens: int
    include_usage: bool
    started: float

    def usage(self, choices: int) -> dict[str, Any]:
        """The whole answer's usage: every choice generated the plan's tokens."""
        return usage(self.prompt_tokens, self.plan.n_tokens * choices)


async def _ends_on_abort(
    stream: AsyncGenerator[bytes, None], rid: str
) -> AsyncGenerator[bytes, None]:
    """An aborted stream ends at once. (SGLang sends a last chunk with ``finish_reason``
    ``"abort"`` in the route's shape first; the sim ends with ``[DONE]`` alone.)"""
    try:
        async for chunk in stream:
            yield chunk
    except Aborted:
        log(f"sim: request {rid} aborted (abort_all)")
        yield DONE


class OpenAIServing:
    def __init__(self, args: SimArgs, knobs: Knobs, state: ServerState) -> None:
        self.args = args
        self.knobs = knobs
        self.state = state
        self.adapters: dict[str, str] = {}  # LoRA adapters (routes.py fills them from argv)
        self.lora_on = False

    # -- common
    async def _run(
        self, req: HttpRequest, body: Callable[[str], Awaitable[HttpReply]]
    ) -> HttpReply:
        """Count the request and make sure ``finish`` runs once, whatever happens."""
        rid = uuid.uuid4().hex
        self.state.begin()
        done = False

        def finish(aborted: bool) -> None:
            nonlocal done
            if done:
                return
            done = True
            self.state.end(aborted)
            if aborted:
                who = " by client" if req.disconnected else ""
                log(f"sim: request {rid} aborted{who}")

        try:
            reply = await body(rid)
        except Aborted:
            finish(True)
            log(f"sim: request {rid} aborted (abort_all)")
            return error_reply("Generation aborted.", "InternalServerError", 500)
        except trio.Cancelled:
            finish(True)
            raise
        except BaseException:
            finish(False)
            raise
        reply.finish = finish
        if reply.stream is not None:
            reply.stream = _ends_on_abort(reply.stream, rid)
            self.state.mark_stream()
            if self.knobs.crash_mid_stream:
                reply.on_chunk = self._crash_counter()
        return reply

    def _crash_counter(self) -> Callable[[], None]:
        limit = self.knobs.crash_mid_stream
        sent = 0

        def on_chunk() -> None:
            nonlocal sent
            sent += 1
            if sent >= limit:
                log(f"sim: KTD_SIM_CRASH_MID_STREAM={limit}: the server process dies now")
                sys.stdout.flush()
                os._exit(1)

        return on_chunk

    async def _run_fields(
        self,
        req: HttpRequest,
        body: Callable[[Fields, str], Awaitable[HttpReply]],
        read: Callable[[HttpRequest], Fields | HttpReply] | None = None,
    ) -> HttpReply:
        """A generation route: counted and finished by ``_run``, its body a JSON object
        (``read``, the OpenAI routes' ``_fields`` unless the API reads its own) before
        the handler sees it, a body that is none answered as SGLang answers it."""

        async def run(rid: str) -> HttpReply:
            f = (read or self._fields)(req)
            return f if isinstance(f, HttpReply) else await body(f, rid)

        return await self._run(req, run)

    def _fields(self, req: HttpRequest) -> Fields | HttpReply:
        """Every generation endpoint starts alike: a JSON object. (While draining SGLang
        still accepts new requests; only ``/health`` turns 503.)"""
        body = parse_body(req)
        if isinstance(body, HttpReply):
            return body
        return Fields(body)

    def _lora_error(self, model: str) -> str | None:
        if ":" not in model:
            return None
        adapter = model.split(":", 1)[1].strip()
        if not adapter:
            return None
        if self.lora_on:
            if adapter in self.adapters:
                return None
            return (
                f"The following requested lora adapters are not loaded: {{'{adapter}'}}. "
                f"Loaded adapters: {sorted(self.adapters)}."
            )
        return (
            f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch "
            "the server with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint."
        )

    def _context_error(self, prompt_tokens: int, max_tokens: int | None) -> str | None:
        ctx = self.args.context_length
        if prompt_tokens >= ctx:
            return (
                f"The input ({prompt_tokens} tokens) is longer than the model's context "
                f"length ({ctx} tokens)."
            )
        if max_tokens is not None and prompt_tokens + max_tokens >= ctx:
            return (
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {prompt_tokens + max_tokens} tokens: "
                f"{prompt_tokens} tokens from the input messages and {max_tokens} tokens for "
                "the completion. Please reduce the number of tokens in the input messages or "
                "the completion to fit within the limit."
            )
        return None

    async def _generate(
        self, n_tokens: int, *, started: float | None = None, prompt: int = 0, choices: int = 1
    ) -> None:
        """Non-streaming generation time: the same pacing as a stream, counted as SGLang
        counts it (tokens, and the time to the first one from ``started``)."""
        if started is None:
            started = trio.current_time()
        quick = not (self.knobs.token_rate or self.knobs.prefill_time or self.knobs.hold)
        if quick and not self.state.hung:
            self.state.first_token(trio.current_time() - started)
        else:
            pacer = Pacer(self.knobs, self.state)
            for i in range(n_tokens):
                await pacer.tick()
                if i == 0:
                    self.state.first_token(trio.current_time() - started)
        self.state.tokens(prompt, n_tokens * choices)

    # -- /v1/chat/completions
    async def chat(self, req: HttpRequest) -> HttpReply:
        return await self._run_fields(req, self._chat)

    async def _chat(self, f: Fields, rid: str) -> HttpReply:
        started = trio.current_time()
        messages = f.required("messages")
        if messages is not None and not (
            isinstance(messages, list)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            f.errors.append(
                field_error("list_type", ("messages",), "Input should be a valid list", messages)
            )
        model = f.str_("model", self.args.served_model_name)
        n = f.int_("n", 1, positive=True) or 1
        max_tokens = f.int_("max_completion_tokens", None, positive=True)
        if max_tokens is None:
            max_tokens = f.int_("max_tokens", None, positive=True)
        stream = f.bool_("stream")
        options = f.stream_options()
        stops = f.stop()
        if f.errors:
            return validation_reply(f.errors)
        lora = self._lora_error(model)
        if lora:
            return error_reply(lora)

        prompt_tokens = sum(gen.count_content(m.get("content")) for m in messages or [])
        ctx_error = self._context_error(prompt_tokens, max_tokens)
        if ctx_error:  # the tokenizer manager checks before a stream starts: a plain 400
            return error_reply(ctx_error)
        plan = gen.plan(max_tokens, stops)
        if stream:
            streamed = Streamed(
                rid, model, plan, prompt_tokens, bool(options.get("include_usage")), started
            )
            events = self._chat_stream(streamed, n, bool(options.get("continuous_usage_stats")))
            return HttpReply(200, content_type=SSE, stream=events)
        await self._generate(plan.n_tokens, started=started, prompt=prompt_tokens, choices=n)
        text = plan.text()
        choices = [chat_choice(i, text, plan.finish_reason, plan.matched_stop) for i in range(n)]
        resp = chat_response(
            rid, int(time.time()), model, choices, usage(prompt_tokens, plan.n_tokens * n)
        )
        return json_reply(resp)

    async def _chat_stream(
        self, s: Streamed, n: int, continuous_usage: bool
    ) -> AsyncGenerator[bytes, None]:
        created = int(time.time())
        self.state.tokens(s.prompt_tokens)
        for i in range(n):
            role = delta_choice(i, role="assistant", content="")
            yield sse(chat_chunk(s.rid, created, s.model, [role]))
        async for step, piece in self._paced(s, n):
            if not piece:
                continue
            for i in range(n):
                chunk = chat_chunk(s.rid, created, s.model, [delta_choice(i, content=piece)])
                if continuous_usage:
                    chunk["usage"] = usage(s.prompt_tokens, step + 1)
                yield sse(chunk)
        plan = s.plan
        for i in range(n):
            finish = delta_choice(
                i, finish_reason=plan.finish_reason, matched_stop=plan.matched_stop
            )
            yield sse(chat_chunk(s.rid, created, s.model, [finish]))
        if s.include_usage:
            yield sse(chat_chunk(s.rid, created, s.model, [], s.usage(n)))
        yield DONE

    async def _paced(self, s: Streamed, choices: int) -> AsyncGenerator[tuple[int, str], None]:
        """The plan's pieces, each at its time (``Pacer``), counted as generated for
        ``choices`` choices; the first one's time is the request's time to first token."""
        pacer = Pacer(self.knobs, self.state)
        for step, piece in enumerate(s.plan.pieces()):
            await pacer.tick()
            if step == 0:
                self.state.first_token(trio.current_time() - s.started)
            self.state.tokens(generated=choices)
            yield step, piece

    # -- /v1/completions
    async def completions(self, req: HttpRequest) -> HttpReply:
        return await self._run_fields(req, self._completions)

    async def _completions(self, f: Fields, rid: str) -> HttpReply:
        started = trio.current_time()
        raw_prompt = f.required("prompt")
        prompts = items_of(raw_prompt) if raw_prompt is not None else []
        if prompts is None:
            f.errors.append(
                field_error(
                    "string_type", ("prompt",), "Input should be a valid string", raw_prompt
                )
            )
        model = f.str_("model", self.args.served_model_name)
        n = f.int_("n", 1, positive=True) or 1
        max_tokens = f.int_("max_tokens", 16, positive=True)
        stream = f.bool_("stream")
        echo = f.bool_("echo")
        options = f.stream_options()
        stops = f.stop()
        if f.errors or prompts is None:
            return validation_reply(f.errors)
        lora = self._lora_error(model)
        if lora:
            return error_reply(lora)

        counts = [gen.count_prompt(p) for p in prompts]
        ctx_error = next(
            (e for e in (self._context_error(c, max_tokens) for c in counts) if e), None
        )
        if ctx_error:
            return error_reply(ctx_error)
        plan = gen.plan(max_tokens, stops)
        echoes = [(p if echo and isinstance(p, str) else "") for p in prompts for _ in range(n)]
        prompt_tokens = sum(counts)
        completion_tokens = plan.n_tokens * len(echoes)
        if stream:
            streamed = Streamed(
                rid, model, plan, prompt_tokens, bool(options.get("include_usage")), started
            )
            events = self._completion_stream(streamed, echoes)
            return HttpReply(200, content_type=SSE, stream=events)
        await self._generate(
            plan.n_tokens, started=started, prompt=prompt_tokens, choices=len(echoes)
        )
        text = plan.text()
        choices = [
            text_choice(i, e + text, plan.finish_reason, plan.matched_stop)
            for i, e in enumerate(echoes)
        ]
        resp = completion_obj(
            rid,
            int(time.time()),
            model,
            choices,
            usage(prompt_tokens, completion_tokens),
            final=True,
        )
        return json_reply(resp)

    async def _completion_stream(
        self, s: Streamed, echoes: list[str]
    ) -> AsyncGenerator[bytes, None]:
        created = int(time.time())
        self.state.tokens(s.prompt_tokens)
        plan, last = s.plan, s.plan.n_tokens - 1
        async for step, piece in self._paced(s, len(echoes)):
            final = step == last
            if not piece and not final:
                continue
            for i, prefix in enumerate(echoes):
                text = prefix + piece if step == 0 else piece
                choice = text_choice(
                    i,
                    text,
                    plan.finish_reason if final else None,
                    plan.matched_stop if final else None,
                )
                yield sse(completion_obj(s.rid, created, s.model, [choice], None, final=False))
        if s.include_usage:
            yield sse(
                completion_obj(s.rid, created, s.model, [], s.usage(len(echoes)), final=False)
            )
        yield DONE

    # -- /v1/embeddings
    async def embeddings(self, req: HttpRequest) -> HttpReply:
        return await self._run_fields(req, self._embeddings)

    async def _embeddings(self, f: Fields, rid: str) -> HttpReply:
        raw = f.required("input")
        items = items_of(raw) if raw is not None else []
        if items is None:
            f.errors.append(
                field_error("string_type", ("input",), "Input should be a valid string", raw)
            )
        model = f.str_("model", self.args.served_model_name)
        if f.errors or items is None:
            return validation_reply(f.errors)
        if not self.args.is_embedding:
            return error_reply(NOT_EMBEDDING)
        lora = self._lora_error(model)
        if lora:
            return error_reply(lora)
        counts = [gen.count_prompt(x) for x in items]
        for c in counts:
            err = self._context_error(c, None)
            if err:
                return error_reply(err)
        await self._generate(1)
        return json_reply(embedding_response(model, [gen.embedding(x) for x in items], sum(counts)))
