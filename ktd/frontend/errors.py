"""OpenAI-shaped errors made by the frontend itself (and Ollama-shaped on Ollama's routes).

OpenAI clients (the official SDKs, LangChain, curl scripts) read
``{"error": {"message", "type", "param", "code"}}`` and pick the exception class
from the HTTP status, so every error the frontend invents uses exactly that
shape and the status the frontend promises (README, "The OpenAI frontend"). On
Ollama's routes (``/api/...``) the same error goes out as Ollama's
``{"error": "<message>"}``, with the same status.
Errors that come from the engine are not made here: they pass through unchanged.
Pure: no I/O, testable without a server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ktd import foreign
from ktd.protocol import ErrorCode

_encoder = msgspec.json.Encoder()

# OpenAI's error types. Clients mostly switch on the status, a few on the type.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"
TIMEOUT = "timeout_error"
RATE_LIMIT = "rate_limit_error"
PERMISSION = "permission_error"


class ApiError(Exception):
    """An error response the frontend sends itself (status + OpenAI body).

    Raised anywhere below a route and turned into a response (or, once a stream
    has started, into a ``data: {"error": ...}`` event) in one place.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        code: str | int | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})

    def payload(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return _encoder.encode(self.payload())

    def ollama_body(self) -> bytes:
        """Ollama's error shape, ``{"error": "<message>"}``: what its clients read (the
        official one raises ``ResponseError(error, status_code)`` from it)."""
        return _encoder.encode({"error": self.message})

    def anthropic_body(self) -> bytes:
        """Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}``."""
        return _encoder.encode(
            {"type": "error", "error": {"type": self.type, "message": self.message}}
        )

    def ndjson(self) -> bytes:
        """The error as the last line of an NDJSON stream (Ollama's in-stream errors)."""
        return self.ollama_body() + b"\n"

    def sse(self) -> bytes:
        """The error as the last event of a stream that already answered 200.

        Same object as SGLang's own mid-stream errors (``{"error": {...}}``) so a
        client handles both alike; the HTTP status goes into ``code`` when the
        error has none, because the real status line is already gone.
        """
        payload = self.payload()
        if payload["error"]["code"] is None:
            payload["error"]["code"] = self.status
        return b"data: " + _encoder.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Kind:
    """One error the frontend makes: its status, OpenAI type and code, and its message
    as a template over the fields the caller gives (a list field is shown sorted,
    comma-separated, or ``empty`` when it has nothing)."""

    status: int
    type: str
    code: str | None
    message: str
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    empty: str = "(none)"


#: Every error the frontend makes, by name (several may share OpenAI's ``code``, as
#: an unknown model and an unknown adapter are both ``model_not_found``).
KINDS: dict[str, Kind] = {
    "bad_request": Kind(400, INVALID_REQUEST, None, "{message}"),
    "missing_api_key": Kind(
        401,
        INVALID_REQUEST,
        "missing_api_key",
        "You didn't provide an API key. Send it in the Authorization header "
        "using Bearer auth (Authorization: Bearer YOUR_KEY).",
        headers={"WWW-Authenticate": "Bearer"},
    ),
    # Never echo the key: it may be a valid key for something else.
    "wrong_api_key": Kind(
        401,
        INVALID_REQUEST,
        "invalid_api_key",
        "Incorrect API key provided.",
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    ),
    "unknown_model": Kind(
        404,
        INVALID_REQUEST,
        "model_not_found",
        "The model `{model}` does not exist. Available models: {available}",
        param="model",
        empty="(none configured)",
    ),
    "unknown_adapter": Kind(
        404,
        INVALID_REQUEST,
        "model_not_found",
        "The model `{model}` does not exist: its engine has no LoRA adapter `{adapter}` "
        "(adapters: {listed})",
        param="model",
    ),
    "model_required": Kind(
        400,
        INVALID_REQUEST,
        "model_required",
        "{path} names no model and {why}: send the header `X-Ktd-Model: <alias>` "
        "(or a `model` field) to choose one.",
        param="model",
    ),
    # A catalog name whose files are not on this host (issue 44): what to run, and why
    # the request did not fetch it itself.
    "not_pulled": Kind(
        404,
        INVALID_REQUEST,
        "model_not_found",
        "The model `{model}` is in ktd's catalog ({catalog}) but not pulled: run "
        "`{command}` on the ktd host (an HTTP request does not start a pull unless "
        "config.json's catalog.http_pulls allows it).",
        param="model",
    ),
    "not_served": Kind(
        404,
        INVALID_REQUEST,
        "model_not_found",
        "The model `{model}` is not served by ktd: {message}",
        param="model",
    ),
    # The rest of the body may still be on its way: never reuse this connection.
    "body_too_large": Kind(
        413,
        INVALID_REQUEST,
        "request_too_large",
        "Request body is larger than the limit of {limit} bytes (frontend.max_body_bytes).",
        headers={"Connection": "close"},
    ),
    "daemon_unreachable": Kind(
        503,
        UNAVAILABLE,
        "daemon_unreachable",
        "ktd daemon is unreachable: {detail}",
        headers={"Retry-After": "5"},
    ),
    # Always with Retry-After (README): the daemon's backoff when it gives one, else 1 s
    # (a load an evict, a reload or a stop ended: the next request may load it again).
    "load_failed": Kind(
        503,
        UNAVAILABLE,
        "engine_failed",
        "The engine for `{model}` failed: {reason}",
        headers={"Retry-After": "1"},
    ),
    "queue_full": Kind(
        429,
        RATE_LIMIT,
        "queue_full",
        "Too many requests for `{model}`: {message}",
        headers={"Retry-After": "1"},
    ),
    "not_loaded": Kind(
        503,
        UNAVAILABLE,
        "model_not_loaded",
        "The model `{model}` is not loaded and frontend.autoload is off; run: ktctl load {model}",
    ),
    "busy": Kind(
        503,
        UNAVAILABLE,
        "engine_busy",
        "The engine for `{model}` is busy: {message}",
        headers={"Retry-After": "5"},
    ),
    "load_timeout": Kind(
        504, TIMEOUT, "load_timeout", "Timed out waiting for `{model}` to load: {message}"
    ),
    # The engine's HTTP connection broke (it died, or stopped answering).
    "upstream_failed": Kind(
        503,
        UNAVAILABLE,
        "upstream_error",
        "The engine for `{model}` failed while answering: {detail}",
    ),
    "upstream_timeout": Kind(
        504,
        TIMEOUT,
        "upstream_timeout",
        "The engine for `{model}` did not answer in time: {detail}",
    ),
    "shutting_down": Kind(503, UNAVAILABLE, "shutting_down", "{message}"),
    # Browsers' requests the frontend does not answer (origin.py).
    "bad_host": Kind(
        403,
        PERMISSION,
        "host_not_allowed",
        "Host `{host}` is not this frontend's: bound to a loopback address it answers "
        "localhost, loopback addresses and frontend.allowed_hosts only",
    ),
    "bad_origin": Kind(
        403,
        PERMISSION,
        "origin_not_allowed",
        "Origin `{origin}` may not use this frontend (add it to frontend.allowed_origins)",
    ),
    "not_json": Kind(
        415,
        INVALID_REQUEST,
        "unsupported_media_type",
        "Send the body as JSON with `Content-Type: application/json` (curl: "
        "-H 'Content-Type: application/json'); a browser's text/plain or form body is "
        "refused, so that no other site's page can post to ktd.",
    ),
    # A named key's own limits (frontend.keys): its scope, its share, its day.
    "model_forbidden": Kind(
        403,
        PERMISSION,
        "model_not_allowed",
        "The key `{key}` may not use the model `{model}`.",
        param="model",
    ),
    "key_busy": Kind(429, RATE_LIMIT, "key_concurrency", "{message}", headers={"Retry-After": "1"}),
    "key_tokens": Kind(429, RATE_LIMIT, "key_tokens_exhausted", "{message}; it resets at {when}"),
    # The key's requests under way hold what is left of its day (``ktd.core.budget``).
    "key_tokens_held": Kind(429, RATE_LIMIT, "key_tokens_reserved", "{message}"),
    "frontend_stopping": Kind(503, UNAVAILABLE, "shutting_down", "The frontend is stopping."),
    "internal": Kind(500, SERVER_ERROR, "internal", "{message}"),
    "unknown_route": Kind(
        404, INVALID_REQUEST, "not_found", "Unknown {what}route: {method} {path}"
    ),
    "method_not_allowed": Kind(
        405, INVALID_REQUEST, "method_not_allowed", "Method {method} is not allowed on {path}"
    ),
    "not_supported": Kind(501, INVALID_REQUEST, "not_supported", "{method} {path}: {why}"),
    "body_timeout": Kind(
        408, INVALID_REQUEST, "body_timeout", "Timed out reading the request body."
    ),
    "disconnected": Kind(400, INVALID_REQUEST, "disconnected", "client went away"),
    "forbidden": Kind(403, INVALID_REQUEST, "forbidden", "{message}"),
    # GET /v1/ktd/requests/{id}: not waiting (never came, began its answer, ended), or
    # another key's (issue 46).
    "request_not_waiting": Kind(
        404,
        INVALID_REQUEST,
        "request_not_waiting",
        "No request `{request_id}` waits here for this key (it began its answer, ended, "
        "or never came).",
    ),
    "conflict": Kind(409, INVALID_REQUEST, None, "{message}"),
    "key_needed": Kind(401, INVALID_REQUEST, "missing_api_key", "This dashboard needs a key."),
    # Ollama's own words for a name it does not know (its clients match on them).
    "ollama_model_not_found": Kind(
        404, INVALID_REQUEST, "model_not_found", "model '{model}' not found{why}"
    ),
    # bad_request / internal / anything newer from the daemon: its problem, not the
    # client's input. 503 so clients retry, never a 500 that looks like a bug here.
    "daemon_error": Kind(503, UNAVAILABLE, "daemon_error", "ktd error ({daemon_code}): {message}"),
}


def make(
    name: str,
    /,
    *,
    param: str | None = None,
    code: str | None = None,
    retry_after: object = None,
    headers: Mapping[str, str] | None = None,
    **fields: object,
) -> ApiError:
    """The error ``name`` of :data:`KINDS` with its message filled from ``fields``;
    ``param``, ``code`` and ``headers`` override the table's, ``retry_after``
    (seconds, when the daemon says when to come back) its ``Retry-After``."""
    kind = KINDS[name]
    shown = {k: _shown(v, kind.empty) for k, v in fields.items()}
    return ApiError(
        kind.status,
        kind.message.format(**shown),
        type=kind.type,
        code=code if code is not None else kind.code,
        param=param if param is not None else kind.param,
        headers={**kind.headers, **(headers or {}), **_retry_after(retry_after)},
    )


def ready_engines(ready: Iterable[str]) -> str:
    """``why`` of ``model_required``: which engines could have answered."""
    names = sorted(ready)
    return f"several engines are ready ({', '.join(names)})" if names else "no engine is ready"


def _shown(value: object, empty: str) -> object:
    if isinstance(value, str) or not isinstance(value, Iterable):
        return value
    return ", ".join(sorted(str(v) for v in value)) or empty


def _retry_after(seconds: object) -> dict[str, str]:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return {"Retry-After": str(max(1, math.ceil(seconds)))}
    return {}


def from_control(model: str, code: str, message: str, detail: Mapping[str, Any]) -> ApiError:
    """Map a daemon ``Error`` reply (protocol.ErrorCode) to the client-facing error."""
    if code == ErrorCode.UNKNOWN_MODEL and isinstance(detail.get("catalog"), str):
        command = detail.get("command") or f"ktctl load {model} --pull"
        return make("not_pulled", model=model, catalog=detail["catalog"], command=command)
    if code == ErrorCode.UNKNOWN_MODEL:
        models = detail.get("models")
        names = [m for m in models if isinstance(m, str)] if isinstance(models, list) else []
        return make("unknown_model", model=model, available=names)
    if code == ErrorCode.NOT_KT:
        return make("not_served", model=model, message=message)
    if code == ErrorCode.LOAD_FAILED:
        reason = detail.get("reason")
        text = reason if isinstance(reason, str) and reason else message
        return make("load_failed", model=model, reason=text, retry_after=detail.get("retry_after"))
    if code == ErrorCode.QUEUE_FULL:
        retry = detail.get("retry_after")
        return make("queue_full", model=model, message=message, retry_after=retry)
    if code == ErrorCode.NOT_LOADED:
        return make("not_loaded", model=model)
    if code == ErrorCode.TIMEOUT:
        return make("load_timeout", model=model, message=message)
    if code == ErrorCode.BUSY:
        return make("busy", model=model, message=message)
    if code == ErrorCode.SHUTTING_DOWN:
        said = message if message.startswith("ktd is shutting down") else None
        text = said or f"ktd is shutting down: {message}"  # never the same words twice
        return make("shutting_down", message=text)
    return make("daemon_error", message=message, daemon_code=code)


def _json_or_none(body: bytes) -> Any:
    """An engine's error body as JSON, or None: it may be plain text (a proxy's page,
    a traceback), which both readers below then quote or reshape as text."""
    try:
        return foreign.json_any(body)
    except msgspec.DecodeError:
        return None


def in_route_shape(api: str, status: int, body: bytes) -> bytes | None:
    """An engine's error answer in the shape its route's clients read, or None when it
    has that shape already. SGLang answers most errors ``{"object": "error", "message",
    "type", "code"}``, which the OpenAI SDKs do not read (the Node one shows "400 status
    code (no body)"): OpenAI routes get ``{"error": {...}}``, Anthropic's
    ``{"type": "error", "error": {...}}``, Ollama's ``{"error": "..."}``; status,
    message and type are the engine's."""
    obj = _json_or_none(body)
    if isinstance(obj, dict):
        inner = obj.get("error")
        if api == "ollama" and isinstance(inner, str):
            return None
        if api == "anthropic" and obj.get("type") == "error" and isinstance(inner, dict):
            return None
        if api == "openai" and isinstance(inner, dict) and "message" in inner:
            return None
    err = from_upstream_body(status, body)
    if api == "ollama":
        return err.ollama_body()
    if api == "anthropic":
        return err.anthropic_body()
    return err.body()


def from_upstream_body(status: int, body: bytes) -> ApiError:
    """Turn an engine error response into an ApiError (for streams already at 200).

    SGLang answers ``{"object": "error", "message", "type", "param", "code"}``
    (not nested); OpenAI-style servers answer ``{"error": {...}}``. Anything
    else is quoted as text.
    """
    message = body[:2000].decode("utf-8", "replace").strip() or f"HTTP {status}"
    etype = INVALID_REQUEST if 400 <= status < 500 else SERVER_ERROR
    code: str | int = status
    param = None
    obj = _json_or_none(body)
    if isinstance(obj, dict):
        nested = obj.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else obj
        if isinstance(inner.get("message"), str):
            message = inner["message"]
        if isinstance(inner.get("type"), str):
            etype = inner["type"]
        if isinstance(inner.get("param"), str):
            param = inner["param"]
        if isinstance(inner.get("code"), (str, int)) and not isinstance(inner.get("code"), bool):
            code = inner["code"]
    return ApiError(status, message, type=etype, param=param, code=code)
