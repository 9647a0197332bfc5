"""Ollama's API as SGLang 0.5.23 serves it itself (``entrypoints/ollama/``).

Why in the sim: ktd's frontend proxies ``/api/chat``, ``/api/generate`` and
``/api/show`` to the engine, so the sim answers them with SGLang's own shapes and
quirks, which the frontend passes through untouched:

* ``stream`` defaults to **true** (pydantic ``stream: bool = True``), read
  leniently (``"yes"``, ``1``... are booleans; ``null`` is a 400). A stream is
  ``application/x-ndjson``, one JSON object and ``\\n`` per token; the last line is
  ``done: true`` with an empty ``content``/``response`` (SGLang drops the last
  token's text there).
* the model name in the request is ignored for generation (one model per server)
  and echoed by ``/api/show``; ``options.num_predict`` is ``max_new_tokens``
  (SGLang defaults it to 2048, and the sim's "model" then stops on its own; the
  prompt and that whole budget must fit in the context).
* an empty ``/api/generate`` prompt answers ``done`` at once (the Ollama CLI sends
  one to load a model).
* a prompt (plus that budget) longer than the context is a ValueError SGLang does
  not catch here: a bare 500 ``Internal Server Error``, or, streaming, a 200 whose
  body is cut without its last chunk.
* bodies are pydantic models without SGLang's JSON content-type check: another
  content type is FastAPI's ``model_attributes_type`` 400.

``/api/tags`` lists the one served model with ``size`` 0 and SGLang's fixed
digest; ``GET``/``HEAD /`` answers ``"SGLang is running"``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from ktd import ollama_shapes
from ktd.ollama_shapes import timestamp
from ktd.sim import gen
from ktd.sim.api import OpenAIServing, Pacer
from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.logfmt import uvicorn
from ktd.sim.shapes import dumps, field_error, json_reply, validation_reply
from ktd.sim.validate import Fields, parse_body

NDJSON = "application/x-ndjson"
DIGEST = "sha256:sglang" + "0" * 58
DEFAULT_MAX_NEW_TOKENS = 2048
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(f: Fields, name: str, default: bool) -> bool:
    """A pydantic ``bool`` field in lax mode, as SGLang's Ollama models read ``stream``."""
    if name not in f.body:
        return default
    v = f.body[name]
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if isinstance(v, str):
        msg = "Input should be a valid boolean, unable to interpret input"
        f.errors.append(field_error("bool_parsing", (name,), msg, v))
    else:
        f.errors.append(field_error("bool_type", (name,), "Input should be a valid boolean", v))
    return default


def _required_str(f: Fields, name: str, loc: tuple[str | int, ...] = ()) -> str:
    where = f.body if not loc else _at(f.body, loc)
    if not isinstance(where, dict) or name not in where:
        f.errors.append(field_error("missing", (*loc, name), "Field required", where))
        return ""
    v = where[name]
    if not isinstance(v, str):
        msg = "Input should be a valid string"
        f.errors.append(field_error("string_type", (*loc, name), msg, v))
        return ""
    return v


def _at(body: dict[str, Any], loc: tuple[str | int, ...]) -> Any:
    cur: Any = body
    for key in loc:
        cur = cur[key]
    return cur


class OllamaServing:
    def __init__(self, openai: OpenAIServing) -> None:
        self.o = openai

    @property
    def _name(self) -> str:
        return self.o.args.served_model_name

    def _fields(self, req: HttpRequest) -> Fields | HttpReply:
        ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype and ctype != "application/json":
            msg = "Input should be a valid dictionary or object to extract fields from"
            return validation_reply([field_error("model_attributes_type", (), msg, req.body)])
        if not ctype:
            req.headers["content-type"] = "application/json"  # FastAPI reads it as JSON
        body = parse_body(req)
        return body if isinstance(body, HttpReply) else Fields(body)

    def _sampling(self, f: Fields) -> tuple[int | None, list[str]]:
        """``options`` -> (max_new_tokens or None for "until EOS", stop strings)."""
        options = f.body.get("options")
        if options is None:
            return None, []
        if not isinstance(options, dict):
            msg = "Input should be a valid dictionary"
            f.errors.append(field_error("dict_type", ("options",), msg, options))
            return None, []
        limit = options.get("num_predict")
        stop = options.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(limit, DEFAULT_MAX_NEW_TOKENS), stops
        return None, stops

    def _too_long(self, prompt_tokens: int, limit: int | None) -> HttpReply | None:
        """A non-streaming request over the context: SGLang's uncaught ValueError, a bare 500.

        Its tokenizer manager counts the prompt and the whole ``max_new_tokens`` budget
        (2048 unless ``num_predict`` says otherwise). (Streaming, the same error is
        raised inside the stream: see ``_lines``.)"""
        message = self.o._context_error(prompt_tokens, limit or DEFAULT_MAX_NEW_TOKENS)
        if message is None:
            return None
        uvicorn("ERROR", f"Exception in ASGI application\nValueError: {message}")
        return HttpReply(500, b"Internal Server Error", "text/plain; charset=utf-8")

    # ------------------------------------------------------------ /api/chat

    async def chat(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._chat, self._fields)

    async def _chat(self, f: Fields, rid: str) -> HttpReply:
        _required_str(f, "model")
        messages = f.required("messages")
        if messages is not None and not isinstance(messages, list):
            f.errors.append(
                field_error("list_type", ("messages",), "Input should be a valid list", messages)
            )
        elif messages is not None:
            for i, m in enumerate(messages):
                if not isinstance(m, dict):
                    f.errors.append(
                        field_error("model_type", ("messages", i), "Input should be an object", m)
                    )
                    continue
                _required_str(f, "role", ("messages", i))
                _required_str(f, "content", ("messages", i))
        stream = lax_bool(f, "stream", True)
        limit, stops = self._sampling(f)
        if f.errors:
            return validation_reply(f.errors)
        prompt = sum(gen.count_content(m.get("content")) for m in messages or [])
        answered = await self._answer(prompt, limit, stops, stream, "chat")
        if isinstance(answered, HttpReply):
            return answered
        plan, took = answered
        return json_reply(
            {
                "model": self._name,
                "created_at": timestamp(),
                "message": {"role": "assistant", "content": plan.text(), "images": None},
                "done": True,
                "done_reason": "stop",
                "total_duration": took,
                "load_duration": None,
                "prompt_eval_count": prompt,
                "prompt_eval_duration": None,
                "eval_count": plan.n_tokens,
                "eval_duration": None,
            }
        )

    # ------------------------------------------------------------ /api/generate

    async def generate(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._generate, self._fields)

    async def _generate(self, f: Fields, rid: str) -> HttpReply:
        _required_str(f, "model")
        text = _required_str(f, "prompt")
        system = f.body.get("system")
        stream = lax_bool(f, "stream", True)
        limit, stops = self._sampling(f)
        if f.errors:
            return validation_reply(f.errors)
        if isinstance(system, str) and system:
            text = f"{system}\n\n{text}"
        if not text.strip():
            done = self._generate_obj("", None, None, None)
            if stream:
                return HttpReply(200, content_type=NDJSON, stream=_once(dumps(done) + b"\n"))
            return json_reply(done)
        prompt = gen.count_text(text)
        answered = await self._answer(prompt, limit, stops, stream, "generate")
        if isinstance(answered, HttpReply):
            return answered
        plan, took = answered
        return json_reply(self._generate_obj(plan.text(), took, prompt, plan.n_tokens))

    def _generate_obj(
        self, text: str, took: int | None, prompt: int | None, n: int | None
    ) -> dict[str, Any]:
        return {
            "model": self._name,
            "created_at": timestamp(),
            "response": text,
            "done": True,
            "done_reason": "stop",
            "context": None,
            "total_duration": took,
            "load_duration": None,
            "prompt_eval_count": prompt,
            "prompt_eval_duration": None,
            "eval_count": n,
            "eval_duration": None,
        }

    async def _answer(
        self, prompt: int, limit: int | None, stops: list[str], stream: bool, kind: str
    ) -> HttpReply | tuple[gen.ChoicePlan, int]:
        """What /api/chat and /api/generate do alike once their fields are read: refuse a
        prompt over the context (not streaming: a stream raises inside), then stream the
        plan, or generate it and give back the plan and the nanoseconds it took."""
        failed = None if stream else self._too_long(prompt, limit)
        if failed is not None:
            return failed
        plan = gen.plan(limit, stops)
        if stream:
            return self._ndjson(plan, prompt, limit, kind)
        started = time.monotonic_ns()
        await self.o._generate(plan.n_tokens)
        return plan, time.monotonic_ns() - started

    def _ndjson(self, plan: gen.ChoicePlan, prompt: int, limit: int | None, kind: str) -> HttpReply:
        return HttpReply(200, content_type=NDJSON, stream=self._lines(plan, prompt, limit, kind))

    async def _lines(
        self, plan: gen.ChoicePlan, prompt: int, limit: int | None, kind: str
    ) -> AsyncGenerator[bytes, None]:
        message = self.o._context_error(prompt, limit or DEFAULT_MAX_NEW_TOKENS)
        if message is not None:  # raised in the generator: uvicorn cuts the response
            raise ValueError(message)
        pacer = Pacer(self.o.knobs, self.o.state)
        pieces = list(plan.pieces())
        for n, piece in enumerate(pieces, 1):
            await pacer.tick()
            done = n == len(pieces)
            text = "" if done else piece
            line: dict[str, Any] = {"model": self._name, "created_at": timestamp()}
            if kind == "chat":
                line["message"] = {"role": "assistant", "content": text, "images": None}
            else:
                line["response"] = text
            line["done"] = done
            line["done_reason"] = "stop" if done else None
            yield dumps(line) + b"\n"

    # ------------------------------------------------------------ tags, show, root

    async def tags(self, req: HttpRequest) -> HttpReply:
        name = self._name
        family = name.split("/")[-1]
        model = {
            "name": name,
            "model": name,
            "modified_at": timestamp(),
            "size": 0,
            "digest": DIGEST,
            "details": {"format": "sglang", "family": family, "parameter_size": "unknown"},
        }
        return json_reply({"models": [model]})

    async def show(self, req: HttpRequest) -> HttpReply:
        f = self._fields(req)
        if isinstance(f, HttpReply):
            return f
        model = _required_str(f, "model")
        if f.errors:
            return validation_reply(f.errors)
        return json_reply(ollama_shapes.show(model, self.o.args.context_length))

    async def root(self, req: HttpRequest) -> HttpReply:
        return json_reply("SGLang is running")


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data
