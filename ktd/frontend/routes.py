"""Which requests the frontend proxies, and how each one names its engine. Pure.

Why a table: every route of SGLang's HTTP surface that clients use goes through
the same proxy (lease, bytes up, bytes back); routes differ only in where the
model name comes from and what the body is:

* ``model: "required"``: the JSON (or multipart form) ``model`` field names the
  engine, exactly (the routing rule: README, "Configure"); missing -> 400, as OpenAI does.
* ``model: "optional"``: SGLang's native and scoring routes, whose ``model``
  field is optional or absent (``/generate`` has none). When the body names no
  model, the ``X-Ktd-Model`` header does; without it the request goes to the
  only ready engine, and with none or several ready a 400 says to send the header.
* ``model: "response"``: ``GET /v1/responses/{id}`` and ``/cancel`` have no
  body; the engine that created the response answers (the frontend remembers
  the ids it has seen), else the ``X-Ktd-Model`` header, else the only ready engine.

``GET /v1/loads`` has no body either: the header, else the only ready engine.
Ollama's ``/api/chat`` and ``/api/generate`` (``api="ollama"``) route by ``model``
like OpenAI's, with Ollama's ``name:latest`` meaning ``name``; the frontend's own
errors there are Ollama-shaped, and streams are NDJSON (ollama.py answers the
rest of Ollama's API).

Paths are normalised first (repeated slashes collapsed, one trailing slash
dropped) so ``//v1/chat/completions`` is the route it looks like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, urlencode

BodyKind = Literal["json", "multipart", "none"]
ModelRule = Literal["required", "optional", "response"]
ApiKind = Literal["openai", "ollama"]

MODEL_HEADER = b"x-ktd-model"


@dataclass(frozen=True)
class ProxyRoute:
    endpoint: str  # the metrics label
    body: BodyKind
    model: ModelRule
    remember: bool = False  # POST /v1/responses: remember the response id's engine
    api: ApiKind = "openai"  # the shape of the frontend's own errors, the stream framing
    query: tuple[str, ...] = ()  # query parameters passed on (every other one stays here)


@dataclass(frozen=True)
class Match:
    route: ProxyRoute
    response_id: str | None = None


EXACT: dict[str, ProxyRoute] = {
    "/v1/chat/completions": ProxyRoute("chat", "json", "required"),
    "/v1/completions": ProxyRoute("completions", "json", "required"),
    "/v1/embeddings": ProxyRoute("embeddings", "json", "required"),
    "/v1/responses": ProxyRoute("responses", "json", "required", remember=True),
    "/v1/messages": ProxyRoute("messages", "json", "required"),
    "/v1/messages/count_tokens": ProxyRoute("count_tokens", "json", "required"),
    "/v1/audio/transcriptions": ProxyRoute("transcriptions", "multipart", "required"),
    "/v1/rerank": ProxyRoute("rerank", "json", "optional"),
    "/v1/score": ProxyRoute("score", "json", "optional"),
    "/v1/classify": ProxyRoute("classify", "json", "optional"),
    "/v1/tokenize": ProxyRoute("tokenize", "json", "optional"),
    "/v1/detokenize": ProxyRoute("detokenize", "json", "optional"),
    "/generate": ProxyRoute("generate", "json", "optional"),
    # Ollama's API, which SGLang serves itself: NDJSON streams, Ollama-shaped errors.
    "/api/chat": ProxyRoute("ollama_chat", "json", "required", api="ollama"),
    "/api/generate": ProxyRoute("ollama_generate", "json", "required", api="ollama"),
}

GET_EXACT: dict[str, ProxyRoute] = {
    # SGLang's load route (per DP rank); its own query parameters reach the engine.
    "/v1/loads": ProxyRoute("loads", "none", "optional", query=("dp_rank", "include", "format")),
}

RESPONSE_GET = ProxyRoute("responses_get", "none", "response")
RESPONSE_CANCEL = ProxyRoute("responses_cancel", "none", "response")

# OpenAI response ids: resp_ + base62/hex (SGLang: resp_<uuid hex>).
_RESPONSE_ID = r"[A-Za-z0-9_\-]{1,200}"
_GET = re.compile(rf"/v1/responses/({_RESPONSE_ID})")
_CANCEL = re.compile(rf"/v1/responses/({_RESPONSE_ID})/cancel")
_SLASHES = re.compile(r"/{2,}")


def normalise(path: str) -> str:
    """Collapse ``//`` runs and drop one trailing slash: never a 500 for an odd path."""
    clean = _SLASHES.sub("/", path) if "//" in path else path
    if len(clean) > 1 and clean.endswith("/"):
        clean = clean[:-1]
    return clean or "/"


def match(method: str, path: str) -> Match | None:
    """The proxy route for ``method path`` (already normalised), or None."""
    if method == "POST":
        route = EXACT.get(path)
        if route is not None:
            return Match(route)
        m = _CANCEL.fullmatch(path)
        if m:
            return Match(RESPONSE_CANCEL, m[1])
    elif method == "GET":
        route = GET_EXACT.get(path)
        if route is not None:
            return Match(route)
        m = _GET.fullmatch(path)
        if m:
            return Match(RESPONSE_GET, m[1])
    return None


def allowed_methods(path: str) -> list[str]:
    """Methods a proxied path answers (for a 405 with ``Allow``); [] = not a proxied path."""
    if path in EXACT or _CANCEL.fullmatch(path):
        return ["POST"]
    if path in GET_EXACT or _GET.fullmatch(path):
        return ["GET"]
    return []


def forwarded_query(route: ProxyRoute, query_string: bytes) -> bytes:
    """The part of the query string the engine may see: only the route's own parameters."""
    if not route.query or not query_string:
        return b""
    kept = [(k, v) for k, v in parse_qsl(query_string.decode("latin-1")) if k in route.query]
    return urlencode(kept).encode("ascii") if kept else b""


def ollama_name(model: str) -> tuple[str, str | None]:
    """Ollama's ``name:tag`` -> (alias, tag or None). ``name:latest`` is ``name``.

    Ollama clients send the ``name:tag`` that ``/api/tags`` lists (``:latest``);
    another tag is kept (ollama.py's ``ollama_alias`` refuses it: SGLang's Ollama API applies
    no LoRA adapter, so ``alias:adapter`` is for the OpenAI routes).
    """
    base, sep, tag = model.partition(":")
    if not sep or not base:
        return model, None
    return (base, None) if tag == "latest" else (base, tag)


def split_lora(model: str) -> tuple[str, str | None]:
    """``alias:adapter`` -> (alias, adapter): SGLang reads the suffix as a LoRA adapter."""
    base, sep, adapter = model.partition(":")
    if sep and base and adapter:
        return base, adapter
    return model, None


_RESP_ID_IN_BODY = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_\-]{1,200})"')


def response_id_in(data: bytes) -> str | None:
    """The first ``"id": "resp_..."`` in a Responses body or first stream event."""
    m = _RESP_ID_IN_BODY.search(data[:65536])
    return m[1].decode() if m else None
