"""SGLang's native and scoring endpoints: ``/generate``, tokenize, rerank, score, classify, ASR.

Why in the sim: ktd's frontend proxies every route of SGLang's HTTP surface, and
tests must see SGLang's own shapes come back through it:

* ``/generate``: ``{"text", "output_ids", "meta_info": {"id", "finish_reason":
  {"type": "length", "length": N}, "prompt_tokens", "completion_tokens", ...}}``;
  streamed as ``data:`` events with the text so far, then ``data: [DONE]``. It
  has no ``model`` field (SGLang serves one model per server).
* ``/v1/tokenize`` ``{"tokens", "count", "max_model_len"}``, ``/v1/detokenize``
  ``{"text"}``; ``/v1/rerank`` a JSON list of ``{"score", "document", "index",
  "meta_info"}`` best first; ``/v1/score`` ``{"scores", "model", "usage",
  "object": "scoring"}``; ``/v1/classify`` a list object of labelled probabilities.
* On a generation model (no ``--is-embedding``) rerank and classify answer SGLang's
  400 "does not appear to be an embedding model", and score without
  ``label_token_ids`` its 400 "label_token_ids is required" (measured on 0.5.23).
* ``/v1/audio/transcriptions`` takes ``multipart/form-data`` (``file``, ``model``)
  and answers ``{"text"}``: a byte count, so tests can tell the file arrived whole.

Token ids are deterministic: word *w* of a prompt is ``1000 + crc32(w) % 30000``.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import AsyncGenerator
from typing import Any

from ktd import multipart
from ktd.sim import gen
from ktd.sim.api import OpenAIServing, Pacer
from ktd.sim.httpd import SSE, HttpReply, HttpRequest
from ktd.sim.shapes import (
    DONE,
    NOT_EMBEDDING,
    WEIGHT_VERSION,
    error_reply,
    field_error,
    json_reply,
    sse,
    usage,
    validation_reply,
)
from ktd.sim.validate import Fields


def token_ids(text: str) -> list[int]:
    return [1000 + zlib.crc32(w.encode()) % 30000 for w in text.split()]


def _score(a: object, b: object) -> float:
    """A stable pseudo-relevance in (0, 1)."""
    return (zlib.crc32(repr((a, b)).encode()) % 10_000 + 1) / 10_001


class NativeServing:
    def __init__(self, openai: OpenAIServing) -> None:
        self.o = openai

    # ------------------------------------------------------------ /generate

    async def generate(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._generate)

    async def _generate(self, f: Fields, rid: str) -> HttpReply:
        text = f.body.get("text")
        ids = f.body.get("input_ids")
        if text is None and ids is None:
            return error_reply("Either text, input_ids or input_embeds should be provided.")
        params = f.body.get("sampling_params") or {}
        if not isinstance(params, dict):
            params = {}
        max_new = params.get("max_new_tokens", 128)
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            return error_reply("max_new_tokens must be a non-negative integer")
        stream = f.bool_("stream")
        if f.errors:
            return validation_reply(f.errors)
        prompt = gen.count_prompt(text) if text is not None else gen.count_prompt(ids)
        ctx_error = self.o._context_error(prompt, max_new)
        if ctx_error:
            return error_reply(ctx_error)
        plan = gen.plan(max_new)
        started = time.monotonic()

        def obj(out: str, n: int, finished: bool) -> dict[str, Any]:
            reason = {"type": "length", "length": plan.n_tokens} if finished else None
            return {
                "text": out,
                "output_ids": [1000 + i for i in range(n)],
                "meta_info": {
                    "id": rid,
                    "finish_reason": reason,
                    "prompt_tokens": prompt,
                    "weight_version": WEIGHT_VERSION,
                    "completion_tokens": n,
                    "cached_tokens": 0,
                    "e2e_latency": round(time.monotonic() - started, 6),
                },
            }

        if not stream:
            await self.o._generate(plan.n_tokens)
            return json_reply(obj(plan.text(), plan.n_tokens, True))

        async def events() -> AsyncGenerator[bytes, None]:
            pacer = Pacer(self.o.knobs, self.o.state)
            so_far = ""
            pieces = list(plan.pieces())
            for n, piece in enumerate(pieces, 1):
                await pacer.tick()
                so_far += piece
                yield sse(obj(so_far, n, n == len(pieces)))
            yield DONE

        return HttpReply(200, content_type=SSE, stream=events())

    # ------------------------------------------------------------ tokenize

    def _required(self, req: HttpRequest, name: str) -> Any:
        """The one field ``/tokenize`` and ``/detokenize`` read, or the 422 (or 400)
        SGLang answers when the body or the field is not there."""
        f = self.o._fields(req)
        if isinstance(f, HttpReply):
            return f
        value = f.required(name)
        return validation_reply(f.errors) if f.errors else value

    async def tokenize(self, req: HttpRequest) -> HttpReply:
        prompt = self._required(req, "prompt")
        if isinstance(prompt, HttpReply):
            return prompt
        ctx = self.o.args.context_length
        if isinstance(prompt, str):
            tokens = token_ids(prompt)
            return json_reply({"tokens": tokens, "count": len(tokens), "max_model_len": ctx})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            many = [token_ids(p) for p in prompt]
            return json_reply(
                {"tokens": many, "count": [len(t) for t in many], "max_model_len": ctx}
            )
        return validation_reply(
            [field_error("string_type", ("prompt",), "Input should be a valid string", prompt)]
        )

    async def detokenize(self, req: HttpRequest) -> HttpReply:
        tokens = self._required(req, "tokens")
        if isinstance(tokens, HttpReply):
            return tokens
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            return validation_reply(
                [field_error("list_type", ("tokens",), "Input should be a valid list", tokens)]
            )
        return json_reply({"text": " ".join(f"tok{t}" for t in tokens)})

    # ------------------------------------------------------------ scoring

    async def rerank(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._rerank)

    async def _rerank(self, f: Fields, rid: str) -> HttpReply:
        query = f.required("query")
        docs = f.required("documents")
        if f.errors:
            return validation_reply(f.errors)
        if not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
            return validation_reply(
                [field_error("list_type", ("documents",), "Input should be a valid list", docs)]
            )
        if not self.o.args.is_embedding:
            return error_reply(NOT_EMBEDDING)
        top_n = f.body.get("top_n")
        keep_docs = f.body.get("return_documents", True) is not False
        rows: list[dict[str, Any]] = [
            {
                "score": _score(query, d),
                "document": d if keep_docs else None,
                "index": i,
                "meta_info": {"id": f"rerank-{i}", "prompt_tokens": gen.count_text(d)},
            }
            for i, d in enumerate(docs)
        ]
        rows.sort(key=lambda r: -r["score"])
        if isinstance(top_n, int) and not isinstance(top_n, bool) and top_n > 0:
            rows = rows[:top_n]
        return json_reply(rows)

    async def score(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._score)

    async def _score(self, f: Fields, rid: str) -> HttpReply:
        query = f.body.get("query")
        items = f.body.get("items")
        labels = f.body.get("label_token_ids")
        if labels is None and not self.o.args.is_embedding:
            return error_reply("label_token_ids is required for generation (CausalLM) models.")
        labels = labels or [1, 2]
        model = f.str_("model", self.o.args.served_model_name)
        if f.errors:
            return validation_reply(f.errors)
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list) or not isinstance(labels, list):
            return error_reply("items and label_token_ids must be lists")
        scores = []
        for item in items:
            raw = [_score((query, item), label) for label in labels]
            if f.body.get("apply_softmax"):
                exps = [math.exp(r) for r in raw]
                raw = [e / sum(exps) for e in exps]
            scores.append(raw)
        tokens = sum(gen.count_prompt(i) for i in items)
        return json_reply(
            {
                "scores": scores,
                "pooled_hidden_states": None,
                "token_logprobs": None,
                "model": model,
                "usage": usage(tokens, 0),
                "object": "scoring",
            }
        )

    async def classify(self, req: HttpRequest) -> HttpReply:
        return await self.o._run_fields(req, self._classify)

    async def _classify(self, f: Fields, rid: str) -> HttpReply:
        raw = f.required("input")
        model = f.str_("model", self.o.args.served_model_name)
        if f.errors:
            return validation_reply(f.errors)
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            return validation_reply(
                [field_error("string_type", ("input",), "Input should be a valid string", raw)]
            )
        if not self.o.args.is_embedding:
            return error_reply(NOT_EMBEDDING)
        data = []
        for i, item in enumerate(items):
            p = _score(item, "label")
            best = 0 if p >= 0.5 else 1
            data.append(
                {"index": i, "label": f"LABEL_{best}", "probs": [p, 1 - p], "num_classes": 2}
            )
        tokens = sum(gen.count_text(i) for i in items)
        return json_reply(
            {
                "id": f"classify-{rid}",
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": data,
                "usage": usage(tokens, 0),
            }
        )

    # ------------------------------------------------------------ audio

    async def transcriptions(self, req: HttpRequest) -> HttpReply:
        return await self.o._run(req, lambda rid: self._transcriptions(req))

    async def _transcriptions(self, req: HttpRequest) -> HttpReply:
        ctype = req.headers.get("content-type", "")
        try:
            fields = {p.name: p for p in multipart.parts(req.body, ctype)}
        except multipart.MultipartError as exc:
            return error_reply(f"There was an error parsing the body: {exc}")
        missing = [
            field_error("missing", (name,), "Field required", None)
            for name in ("file", "model")
            if name not in fields
        ]
        if missing:
            return validation_reply(missing)
        audio = fields["file"]
        text = f"sim heard {len(audio.data)} bytes of {audio.content_type or 'audio'}"
        fmt = fields.get("response_format")
        if fmt is not None and fmt.data == b"text":
            return HttpReply(200, text.encode(), "text/plain; charset=utf-8")
        return json_reply({"text": text, "usage": {"type": "duration", "seconds": 1}})
