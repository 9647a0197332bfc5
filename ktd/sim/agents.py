"""``/v1/responses`` (OpenAI Responses) and ``/v1/messages`` (Anthropic), as SGLang answers them.

Why these two: they are what coding agents speak (Codex-style agents use
Responses, Claude-Code-style ones Anthropic Messages), and ktd's frontend must
pass them through untouched, so the sim answers with SGLang's own shapes:

* Responses: a ``response`` object (``resp_`` id, ``output`` of one assistant
  message with ``output_text``, ``usage`` with ``input_tokens``/``output_tokens``);
  streams are ``event: <type>`` + ``data:`` pairs from ``response.created`` to
  ``response.completed`` with no ``[DONE]``. Stored responses answer
  ``GET /v1/responses/{id}``; ``/cancel`` of a finished one is the fork's 400
  "Cannot cancel a synchronous response". Upstream 0.5.23 stores nothing unless
  launched with ``--enable-response-store`` (GET and cancel are then its 400
  "Response store is disabled"), and cancels a finished response by answering it.
* Messages: SGLang converts to a chat request and back, serialising with
  ``exclude_none``; errors use Anthropic's ``{"type": "error", "error": {...}}``;
  streams run ``message_start`` .. ``message_stop`` (no ``ping`` events), and
  ``/v1/messages/count_tokens`` answers ``{"input_tokens": N}``.

Generation goes through ``OpenAIServing``'s accounting, so ``/sim/stats``
counts these requests like chat ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any

from ktd.sim import flags, gen
from ktd.sim.api import OpenAIServing, Pacer
from ktd.sim.httpd import SSE, HttpReply, HttpRequest
from ktd.sim.shapes import (
    STOP_REASONS,
    anthropic_error,
    anthropic_message,
    anthropic_usage,
    error_reply,
    field_error,
    json_reply,
    named_event,
    response_message,
    response_obj,
    response_usage,
    validation_reply,
)
from ktd.sim.validate import Fields, parse_body

_STORED = 256  # responses kept for GET /v1/responses/{id}


def _input_tokens(value: Any) -> int:
    """Responses ``input``: a string, or a list of messages/items with content."""
    if isinstance(value, str):
        return gen.count_text(value)
    total = 0
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                total += gen.count_content(item.get("content"))
                if isinstance(item.get("text"), str):
                    total += gen.count_text(item["text"])
    return total


def _anthropic_tokens(body: dict[str, Any]) -> int:
    total = 0
    system = body.get("system")
    if isinstance(system, str):
        total += gen.count_text(system)
    elif isinstance(system, list):
        total += gen.count_content(system)
    for msg in body.get("messages") or []:
        if isinstance(msg, dict):
            total += gen.count_content(msg.get("content"))
    return total


class AgentServing:
    def __init__(self, openai: OpenAIServing) -> None:
        self.o = openai
        self.stored: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # The fork (0.7.2) always keeps responses; upstream 0.5.23 only with the flag.
        self.upstream = flags.flavor() == "upstream"
        self.keep = not self.upstream or bool(openai.args.server_args.get("enable_response_store"))

    # ------------------------------------------------------------ /v1/responses

    async def responses(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._responses)

    async def _responses(self, f: Fields, rid: str) -> HttpReply:
        raw_input = f.required("input")
        model = f.str_("model", self.o.args.served_model_name)
        max_tokens = f.int_("max_output_tokens", None, positive=True)
        stream = f.bool_("stream")
        instructions = f.body.get("instructions")
        previous = f.body.get("previous_response_id")
        if f.errors:
            return validation_reply(f.errors)
        lora = self.o._lora_error(model)
        if lora:
            return error_reply(lora)
        prompt = _input_tokens(raw_input)
        if isinstance(instructions, str):
            prompt += gen.count_text(instructions)
        ctx_error = self.o._context_error(prompt, max_tokens)
        if ctx_error:
            return error_reply(ctx_error)
        plan = gen.plan(max_tokens)
        resp_id = f"resp_{rid}"
        item_id = f"msg_{rid}"
        created = int(time.time())

        def build(status: str, text: str, usage_obj: dict[str, Any] | None) -> dict[str, Any]:
            output = [response_message(item_id, text)] if status == "completed" else []
            return response_obj(
                resp_id,
                created,
                model,
                status,
                output,
                usage_obj,
                max_output_tokens=max_tokens,
                instructions=instructions if isinstance(instructions, str) else None,
                previous_response_id=previous if isinstance(previous, str) else None,
            )

        final_usage = response_usage(prompt, plan.n_tokens)
        if not stream:
            await self.o._generate(plan.n_tokens)
            obj = build("completed", plan.text(), final_usage)
            self._store(obj)
            return json_reply(obj)

        async def events() -> AsyncGenerator[bytes, None]:
            seq = 0

            def ev(kind: str, **fields: Any) -> bytes:
                nonlocal seq
                data = {"type": kind, "sequence_number": seq, **fields}
                seq += 1
                return named_event(kind, data)

            yield ev("response.created", response=build("in_progress", "", None))
            yield ev("response.in_progress", response=build("in_progress", "", None))
            yield ev(
                "response.output_item.added",
                output_index=0,
                item=response_message(item_id, "", "in_progress"),
            )
            part: dict[str, Any] = {
                "type": "output_text",
                "text": "",
                "annotations": [],
                "logprobs": None,
            }
            yield ev(
                "response.content_part.added",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part=part,
            )
            pacer = Pacer(self.o.knobs, self.o.state)
            for piece in plan.pieces():
                await pacer.tick()
                if piece:
                    yield ev(
                        "response.output_text.delta",
                        item_id=item_id,
                        output_index=0,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
            text = plan.text()
            yield ev(
                "response.output_text.done",
                item_id=item_id,
                output_index=0,
                content_index=0,
                text=text,
                logprobs=[],
            )
            yield ev(
                "response.content_part.done",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part={**part, "text": text},
            )
            yield ev(
                "response.output_item.done", output_index=0, item=response_message(item_id, text)
            )
            done = build("completed", text, final_usage)
            self._store(done)
            yield ev("response.completed", response=done)

        return HttpReply(200, content_type=SSE, stream=events())

    def _store(self, obj: dict[str, Any]) -> None:
        if not self.keep:
            return
        self.stored[obj["id"]] = obj
        while len(self.stored) > _STORED:
            self.stored.popitem(last=False)

    def _not_found(self, response_id: str) -> HttpReply:
        return error_reply(f"Response with id '{response_id}' not found.", "NotFoundError", 404)

    def _store_disabled(self) -> HttpReply:
        """Upstream 0.5.23 without ``--enable-response-store``: nothing is kept."""
        message = (
            "Response store is disabled. Stateful Responses require --enable-response-store "
            "on a standalone server; response storage is unavailable in PD mode."
        )
        err = {"message": message, "type": "invalid_request_error", "param": "response_id"}
        return json_reply({"error": {**err, "code": 400}}, 400)

    async def retrieve(self, req: HttpRequest, response_id: str) -> HttpReply:
        if not self.keep:
            return self._store_disabled()
        obj = self.stored.get(response_id)
        return self._not_found(response_id) if obj is None else json_reply(obj)

    async def cancel(self, req: HttpRequest, response_id: str) -> HttpReply:
        """A finished response: the fork refuses (400), upstream answers it as it is."""
        if not self.keep:
            return self._store_disabled()
        obj = self.stored.get(response_id)
        if obj is None:
            return self._not_found(response_id)
        if self.upstream:
            return json_reply(obj)
        return error_reply("Cannot cancel a synchronous response.", "invalid_request_error")

    # ------------------------------------------------------------ /v1/messages

    def _anthropic_body(self, req: HttpRequest) -> dict[str, Any] | HttpReply:
        body = parse_body(req)
        if isinstance(body, HttpReply):
            return body
        errors = []
        if not isinstance(body.get("model"), str):
            errors.append(field_error("missing", ("model",), "Field required", body))
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages
        ):
            errors.append(
                field_error("list_type", ("messages",), "Input should be a valid list", messages)
            )
        if errors:
            return validation_reply(errors)
        return body

    async def messages(self, req: HttpRequest) -> HttpReply:
        return await self.o._run(req, lambda rid: self._messages(req, rid))

    async def _messages(self, req: HttpRequest, rid: str) -> HttpReply:
        body = self._anthropic_body(req)
        if isinstance(body, HttpReply):
            return body
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return validation_reply(
                [
                    field_error(
                        "int_type", ("max_tokens",), "Input should be a valid integer", max_tokens
                    )
                ]
            )
        model: str = body["model"]
        lora = self.o._lora_error(model)
        if lora:
            return anthropic_error(lora)
        prompt = _anthropic_tokens(body)
        ctx_error = self.o._context_error(prompt, max_tokens)
        if ctx_error:
            return anthropic_error(ctx_error)
        stops = [s for s in body.get("stop_sequences") or [] if isinstance(s, str)]
        plan = gen.plan(max_tokens, stops)
        mid = f"msg_{rid}"
        stop_reason = STOP_REASONS.get(plan.finish_reason, "end_turn")
        if not body.get("stream"):
            await self.o._generate(plan.n_tokens)
            usage_obj = anthropic_usage(prompt, plan.n_tokens)
            return json_reply(anthropic_message(mid, model, plan.text(), stop_reason, usage_obj))

        async def events() -> AsyncGenerator[bytes, None]:
            start = anthropic_message(mid, model, None, None, anthropic_usage(prompt, 0))
            yield named_event("message_start", {"type": "message_start", "message": start})
            pacer = Pacer(self.o.knobs, self.o.state)
            opened = False
            for piece in plan.pieces():
                await pacer.tick()
                if not piece:
                    continue
                if not opened:
                    opened = True
                    yield named_event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": 0,
                            "content_block": {"type": "text", "text": ""},
                        },
                    )
                yield named_event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                )
            if opened:
                yield named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason},
                    "usage": anthropic_usage(prompt, plan.n_tokens),
                },
            )
            yield named_event("message_stop", {"type": "message_stop"})

        return HttpReply(200, content_type=SSE, stream=events())

    async def count_tokens(self, req: HttpRequest) -> HttpReply:
        body = self._anthropic_body(req)
        if isinstance(body, HttpReply):
            return body
        return json_reply({"input_tokens": _anthropic_tokens(body)})
