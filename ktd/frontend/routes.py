"""Every route of the frontend, in one table: its path, its methods, who answers it. Pure.

Why one table: the frontend answers four kinds of route (proxied to an engine, Ollama's
answers over every model, the dashboard, and Quart's own: health, metrics, the model
list), and a path belongs to exactly one row here. The router (router.py) looks a
request up once, answers an unknown path (404) or a wrong method (405, with ``Allow``)
in the path's own error shape, and hands the rest to the row's owner; Quart's rules
are made from this table too. A new route is a new row.

Proxied routes differ only in where the model name comes from and what the body is:

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
errors there are Ollama-shaped, and streams are NDJSON.

Paths are normalised first (repeated slashes collapsed, one trailing slash
dropped) so ``//v1/chat/completions`` is the route it looks like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, urlencode

BodyKind = Literal["json", "multipart", "none"]
ModelRule = Literal["required", "optional", "response"]
#: The shape of a route's errors (and, proxied, its stream framing): OpenAI's, Ollama's,
#: or the dashboard's (OpenAI's body with the page's own headers).
ApiKind = Literal["openai", "ollama", "ui"]
#: Who answers a route: the proxy (flow.py), Ollama's own answers (ollama.py), the
#: dashboard (ui/asgi.py), or Quart (app.py, worker_info.py).
Owner = Literal["proxy", "ollama", "ui", "app"]

MODEL_HEADER = b"x-ktd-model"


@dataclass(frozen=True)
class Route:
    """One row of the frontend's route table: a path, its methods, who answers it.

    ``path`` is exact, or has one variable part in Quart's syntax (``<name>``: an id of
    letters, digits, ``_`` and ``-``; ``<path:name>``: the rest of the path, slashes and
    all). ``endpoint`` names the owner's handler, the Quart endpoint, and the metrics label.
    ``open``: answered without an API key (Ollama's probes, the dashboard's page and
    session). The last four fields matter to proxied routes only.
    """

    path: str
    methods: tuple[str, ...]
    owner: Owner
    endpoint: str
    api: ApiKind = "openai"
    open: bool = False
    body: BodyKind = "none"
    model: ModelRule = "optional"
    remember: bool = False  # POST /v1/responses: remember the response id's engine
    query: tuple[str, ...] = ()  # query parameters passed on (every other one stays here)


@dataclass(frozen=True)
class Match:
    route: Route
    param: str | None = None  # the path's variable part: a response id, a model id, a digest


_WORDS: dict[str, tuple[str, object]] = {
    **{v: ("body", v) for v in get_args(BodyKind)},
    **{v: ("model", v) for v in get_args(ModelRule)},
    **{v: ("api", v) for v in get_args(ApiKind)},
    "open": ("open", True),
    "remember": ("remember", True),
}


def _rows(owner: Owner, table: str, **fields: Any) -> tuple[Route, ...]:
    """Rows of one owner written one a line, ``METHODS PATH ENDPOINT [WORD...]``: methods
    joined by ``,``; each word sets the field it is a value of (``json``: the body,
    ``required``: the model rule, ``ollama``: the API; ``open``, ``remember``).
    ``fields`` hold for every row (a block's API, a row's query parameters)."""
    out = []
    for line in table.splitlines():
        if not line.strip():
            continue
        methods, path, endpoint, *words = line.split()
        unknown = [w for w in words if w not in _WORDS]
        if unknown:
            raise ValueError(f"routes.py: {path}: unknown words {unknown}")
        row = fields | dict(_WORDS[w] for w in words)
        out.append(Route(path, tuple(methods.split(",")), owner, endpoint, **row))
    return tuple(out)


TABLE: tuple[Route, ...] = (
    # Proxied to an engine (flow.py): where the model name comes from, what the body is.
    *_rows(
        "proxy",
        """
        POST      /v1/chat/completions                chat              json       required
        POST      /v1/completions                     completions       json       required
        POST      /v1/embeddings                      embeddings        json       required
        POST      /v1/responses                       responses         json       required remember
        GET       /v1/responses/<response_id>         responses_get     none       response
        POST      /v1/responses/<response_id>/cancel  responses_cancel  none       response
        POST      /v1/messages                        messages          json       required
        POST      /v1/messages/count_tokens           count_tokens      json       required
        POST      /v1/audio/transcriptions            transcriptions    multipart  required
        POST      /v1/rerank                          rerank            json       optional
        POST      /v1/score                           score             json       optional
        POST      /v1/classify                        classify          json       optional
        POST      /v1/tokenize                        tokenize          json       optional
        POST      /v1/detokenize                      detokenize        json       optional
        POST      /generate                           generate          json       optional
        """,
    ),
    # SGLang's load route (per DP rank); its own query parameters reach the engine.
    *_rows("proxy", "GET /v1/loads loads", query=("dp_rank", "include", "format")),
    # Ollama's API, which SGLang serves itself: NDJSON streams, Ollama-shaped errors.
    *_rows(
        "proxy",
        """
        POST      /api/chat                           ollama_chat       json       required
        POST      /api/generate                       ollama_generate   json       required
        """,
        api="ollama",
    ),
    # Ollama's API that the frontend answers itself, over every configured model (ollama.py).
    *_rows(
        "ollama",
        """
        GET,HEAD  /                                   root              open
        GET,HEAD  /api/version                        version           open
        GET,HEAD  /api/tags                           tags
        GET       /api/ps                             ps
        POST      /api/show                           show
        POST      /api/pull                           pull
        POST      /api/push                           push
        POST      /api/create                         create
        POST      /api/copy                           copy
        DELETE    /api/delete                         delete
        POST,HEAD /api/blobs/<path:digest>            blobs
        POST      /api/embed                          embed
        POST      /api/embeddings                     embeddings_ollama
        """,
        api="ollama",
    ),
    # The dashboard (ui/asgi.py).
    *_rows(
        "ui",
        """
        GET       /ui                                 index             open
        GET       /ui/favicon.svg                     favicon           open
        GET       /ui/api/session                     session           open
        POST      /ui/api/login                       login             open
        POST      /ui/api/logout                      logout            open
        GET       /ui/api/view                        view
        GET       /ui/api/series                      series
        GET       /ui/api/events                      events
        GET       /ui/api/logs                        logs
        GET       /ui/api/plan                        plan
        GET       /ui/api/usage                       usage
        GET       /ui/api/waiting                     waiting
        POST      /ui/api/action                      action
        GET       /ui/api/config                      config
        POST      /ui/api/config/plan                 config_plan
        POST      /ui/api/config/apply                config_apply
        """,
        api="ui",
    ),
    # The frontend's own answers, served by Quart (app.py; worker_info.py: what
    # sglang-router reads of a worker; waitroutes.py: requests waiting for their
    # engine, issue 46).
    *_rows(
        "app",
        """
        GET,HEAD  /health                             health
        GET,HEAD  /metrics                            metrics
        GET,HEAD  /v1/models                          models
        GET,HEAD  /v1/models/<path:model_id>          retrieve_model
        GET,HEAD  /server_info                        server_info
        GET,HEAD  /get_server_info                    get_server_info
        GET,HEAD  /model_info                         model_info
        GET,HEAD  /get_model_info                     get_model_info
        GET,HEAD  /get_load                           get_load
        GET,HEAD  /v1/ktd/requests                    waiting_requests
        GET,HEAD  /v1/ktd/requests/<request_id>       waiting_request
        """,
    ),
)

# Exact paths -> their rows; paths with a variable part as one regex each, tried in turn.
_EXACT: dict[str, tuple[Route, ...]] = {}
_PATTERNS: list[tuple[re.Pattern[str], tuple[Route, ...]]] = []
_VARIABLE = re.compile(r"<(?:(path):)?(\w+)>")
_ID = r"[A-Za-z0-9_\-]{1,200}"  # OpenAI's response ids: resp_ + base62/hex (SGLang: resp_<hex>)


def _compile(path: str) -> re.Pattern[str]:
    parts = _VARIABLE.split(path)  # [text, kind, name, text, ...]
    if len(parts) != 4:
        raise ValueError(f"{path}: a route has at most one variable part")
    return re.compile(
        re.escape(parts[0]) + ("(.+)" if parts[1] else f"({_ID})") + re.escape(parts[3])
    )


def _index() -> None:
    by_path: dict[str, list[Route]] = {}
    for route in TABLE:
        by_path.setdefault(route.path, []).append(route)
    for path, rows in by_path.items():
        if "<" in path:
            _PATTERNS.append((_compile(path), tuple(rows)))
        else:
            _EXACT[path] = tuple(rows)


_index()
_SLASHES = re.compile(r"/{2,}")


def normalise(path: str) -> str:
    """Collapse ``//`` runs and drop one trailing slash: never a 500 for an odd path."""
    clean = _SLASHES.sub("/", path) if "//" in path else path
    if len(clean) > 1 and clean.endswith("/"):
        clean = clean[:-1]
    return clean or "/"


def rows(path: str) -> tuple[tuple[Route, ...], str | None]:
    """The table's rows for ``path`` (already normalised), and its variable part."""
    exact = _EXACT.get(path)
    if exact is not None:
        return exact, None
    for pattern, found in _PATTERNS:
        m = pattern.fullmatch(path)
        if m:
            return found, m[1]
    return (), None


def match(method: str, path: str) -> Match | None:
    """The route for ``method path`` (already normalised), or None."""
    found, param = rows(path)
    for route in found:
        if method in route.methods:
            return Match(route, param)
    return None


def allowed_methods(path: str) -> list[str]:
    """Methods ``path`` answers (for a 405 with ``Allow``); [] = no such route."""
    return [m for route in rows(path)[0] for m in route.methods]


def api_of(path: str) -> ApiKind:
    """The error shape of a path, routed or not: Ollama's under ``/api/`` and at ``/``
    (what Ollama's tools probe), the dashboard's under ``/ui``, else OpenAI's."""
    if path == "/" or path.startswith("/api/"):
        return "ollama"
    if path == "/ui" or path.startswith("/ui/"):
        return "ui"
    return "openai"


def forwarded_query(route: Route, query_string: bytes) -> bytes:
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


_RESP_ID_IN_BODY = re.compile(rb'"id"\s*:\s*"(resp_' + _ID.encode() + rb')"')


def response_id_in(data: bytes) -> str | None:
    """The first ``"id": "resp_..."`` in a Responses body or first stream event."""
    m = _RESP_ID_IN_BODY.search(data[:65536])
    return m[1].decode() if m else None
