"""Request checks as SGLang's FastAPI/pydantic layer makes them, on plain dicts.

Why not pydantic: the sim must import fast. Only the fields the sim reads are
checked, with pydantic's error types and messages, and every error is
collected so one 400 lists them all, as FastAPI's does. Unknown fields pass.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ktd.sim.httpd import HttpReply, HttpRequest
from ktd.sim.shapes import field_error, validation_reply

_decode = msgspec.json.Decoder().decode


def json_invalid(raw: bytes) -> dict[str, Any]:
    """FastAPI's error for a body that is not JSON: the position and reason of
    ``json.loads`` (what FastAPI itself calls)."""
    try:
        json.loads(raw)
        pos, why = 0, "Invalid JSON"
    except ValueError as exc:
        pos = getattr(exc, "pos", 0)
        why = getattr(exc, "msg", str(exc))
    return {
        "type": "json_invalid",
        "loc": ("body", pos),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": why},
    }


def parse_body(req: HttpRequest) -> dict[str, Any] | HttpReply:
    """The JSON object of a request, or SGLang's 400 for what FastAPI would reject."""
    ctype = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        err: dict[str, Any] = {
            "loc": ["header", "content-type"],
            "msg": "Unsupported Media Type: Only 'application/json' is allowed",
            "type": "value_error",
        }
        return validation_reply([err])
    try:
        body = _decode(req.body)
    except msgspec.DecodeError:
        return validation_reply([json_invalid(req.body)])
    if not isinstance(body, dict):
        return validation_reply(
            [
                field_error(
                    "model_attributes_type",
                    (),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    return body


class Fields:
    """Pydantic-like checks of the few fields the sim reads; collects every error."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.errors: list[dict[str, Any]] = []

    def str_(self, name: str, default: str) -> str:
        v = self.body.get(name, default)
        if not isinstance(v, str):
            self.errors.append(
                field_error("string_type", (name,), "Input should be a valid string", v)
            )
            return default
        return v

    def bool_(self, name: str) -> bool:
        v = self.body.get(name)
        if v is None:
            return False
        if not isinstance(v, bool):
            self.errors.append(
                field_error("bool_type", (name,), "Input should be a valid boolean", v)
            )
            return False
        return v

    def int_(self, name: str, default: int | None, *, positive: bool = False) -> int | None:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            self.errors.append(
                field_error("int_type", (name,), "Input should be a valid integer", v)
            )
            return default
        if positive and v <= 0:
            msg = f"Value error, {name} must be positive"
            self.errors.append(field_error("value_error", (name,), msg, v))
            return default
        return v

    def stop(self) -> list[str]:
        v = self.body.get("stop")
        if v is None:
            return []
        if isinstance(v, str):
            return [v]
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return list(v)
        self.errors.append(
            field_error("string_type", ("stop",), "Input should be a valid string", v)
        )
        return []

    def stream_options(self) -> dict[str, Any]:
        v = self.body.get("stream_options")
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.errors.append(
                field_error("model_type", ("stream_options",), "Input should be an object", v)
            )
            return {}
        return v

    def required(self, name: str) -> Any:
        if name not in self.body:
            self.errors.append(field_error("missing", (name,), "Field required", self.body))
        return self.body.get(name)


def items_of(value: Any) -> list[Any] | None:
    """A prompt/input: str | list[str] | list[int] | list[list[int]] -> its items."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [value]
        if all(isinstance(x, str) for x in value):
            return list(value)
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in value):
            return list(value)
    return None
