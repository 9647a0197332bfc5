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
from typing import Any

import msgspec

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


# ---------------------------------------------------------------- constructors


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def missing_api_key() -> ApiError:
    return ApiError(
        401,
        "You didn't provide an API key. Send it in the Authorization header "
        "using Bearer auth (Authorization: Bearer YOUR_KEY).",
        type=INVALID_REQUEST,
        code="missing_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def wrong_api_key() -> ApiError:
    # Never echo the key: it may be a valid key for something else.
    return ApiError(
        401,
        "Incorrect API key provided.",
        type=INVALID_REQUEST,
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )


def unknown_model(model: str, available: Iterable[str]) -> ApiError:
    names = sorted(available)
    listing = ", ".join(names) if names else "(none configured)"
    return ApiError(
        404,
        f"The model `{model}` does not exist. Available models: {listing}",
        type=INVALID_REQUEST,
        code="model_not_found",
        param="model",
    )


def unknown_adapter(model: str, adapter: str, listed: Iterable[str]) -> ApiError:
    names = ", ".join(sorted(listed)) or "(none)"
    return ApiError(
        404,
        f"The model `{model}` does not exist: its engine has no LoRA adapter `{adapter}` "
        f"(adapters: {names})",
        code="model_not_found",
        param="model",
    )


def no_model_for_route(path: str, ready: Iterable[str]) -> ApiError:
    names = sorted(ready)
    why = f"several engines are ready ({', '.join(names)})" if names else "no engine is ready"
    return ApiError(
        400,
        f"{path} names no model and {why}: send the header `X-Ktd-Model: <alias>` "
        "(or a `model` field) to choose one.",
        param="model",
        code="model_required",
    )


def not_served(model: str, message: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` is not served by ktd: {message}",
        type=INVALID_REQUEST,
        code="model_not_found",
        param="model",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"Request body is larger than the limit of {limit} bytes (frontend.max_body_bytes).",
        code="request_too_large",
        # The rest of the body may still be on its way: never reuse this connection.
        headers={"Connection": "close"},
    )


def daemon_unreachable(detail: str) -> ApiError:
    return ApiError(
        503,
        f"ktd daemon is unreachable: {detail}",
        type=UNAVAILABLE,
        code="daemon_unreachable",
        headers={"Retry-After": "5"},
    )


def _retry_after(seconds: object) -> dict[str, str]:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return {"Retry-After": str(max(1, math.ceil(seconds)))}
    return {}


def load_failed(model: str, reason: str, retry_after: object = None) -> ApiError:
    """503; with ``Retry-After`` when the daemon says when the next attempt may run."""
    return ApiError(
        503,
        f"The engine for `{model}` failed: {reason}",
        type=UNAVAILABLE,
        code="engine_failed",
        headers=_retry_after(retry_after),
    )


def queue_full(model: str, message: str, retry_after: object = None) -> ApiError:
    """429: the model's admission queue (``max_queue``) is full; come back later."""
    return ApiError(
        429,
        f"Too many requests for `{model}`: {message}",
        type=RATE_LIMIT,
        code="queue_full",
        headers=_retry_after(retry_after) or {"Retry-After": "1"},
    )


def not_loaded(model: str) -> ApiError:
    return ApiError(
        503,
        f"The model `{model}` is not loaded and frontend.autoload is off; run: ktctl load {model}",
        type=UNAVAILABLE,
        code="model_not_loaded",
    )


def busy(model: str, message: str) -> ApiError:
    return ApiError(
        503,
        f"The engine for `{model}` is busy: {message}",
        type=UNAVAILABLE,
        code="engine_busy",
        headers={"Retry-After": "5"},
    )


def load_timeout(model: str, message: str) -> ApiError:
    return ApiError(
        504,
        f"Timed out waiting for `{model}` to load: {message}",
        type=TIMEOUT,
        code="load_timeout",
    )


def upstream_failed(model: str, detail: str) -> ApiError:
    """The engine's HTTP connection broke (it died, or stopped answering)."""
    return ApiError(
        503,
        f"The engine for `{model}` failed while answering: {detail}",
        type=UNAVAILABLE,
        code="upstream_error",
    )


def upstream_timeout(model: str, detail: str) -> ApiError:
    return ApiError(
        504,
        f"The engine for `{model}` did not answer in time: {detail}",
        type=TIMEOUT,
        code="upstream_timeout",
    )


def from_control(model: str, code: str, message: str, detail: Mapping[str, Any]) -> ApiError:
    """Map a daemon ``Error`` reply (protocol.ErrorCode) to the client-facing error."""
    if code == ErrorCode.UNKNOWN_MODEL:
        models = detail.get("models")
        names = [m for m in models if isinstance(m, str)] if isinstance(models, list) else []
        return unknown_model(model, names)
    if code == ErrorCode.NOT_KT:
        return not_served(model, message)
    if code == ErrorCode.LOAD_FAILED:
        reason = detail.get("reason")
        text = reason if isinstance(reason, str) and reason else message
        return load_failed(model, text, detail.get("retry_after"))
    if code == ErrorCode.QUEUE_FULL:
        return queue_full(model, message, detail.get("retry_after"))
    if code == ErrorCode.NOT_LOADED:
        return not_loaded(model)
    if code == ErrorCode.TIMEOUT:
        return load_timeout(model, message)
    if code == ErrorCode.BUSY:
        return busy(model, message)
    if code == ErrorCode.SHUTTING_DOWN:
        said = message if message.startswith("ktd is shutting down") else None
        text = said or f"ktd is shutting down: {message}"  # never the same words twice
        return ApiError(503, text, type=UNAVAILABLE, code="shutting_down")
    # bad_request / internal / anything newer: the daemon's problem, not the
    # client's input. 503 so clients retry, never a 500 that looks like a bug here.
    return ApiError(503, f"ktd error ({code}): {message}", type=UNAVAILABLE, code="daemon_error")


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
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        obj = None
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
