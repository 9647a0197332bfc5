"""Read just enough of an OpenAI request body to route it.

The body goes to the engine byte for byte: the frontend decodes only ``model``
and ``stream`` (msgspec skips every other field without building objects) and
never re-encodes, so fields this code has never heard of reach SGLang intact and
a 10 MB prompt costs one fast scan, not a dict of Python strings.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

import msgspec
import trio

from ktd import foreign
from ktd import protocol as p
from ktd.frontend import errors


class RequestHead(msgspec.Struct):
    """The two fields routing needs; everything else is ignored, not rejected."""

    model: Any = msgspec.UNSET
    stream: Any = msgspec.UNSET


class Peeked(msgspec.Struct, frozen=True):
    model: str | None  # None only when the route allows it (``require_model=False``)
    stream: bool


_decoder = msgspec.json.Decoder(RequestHead)


def parse_head(body: bytes, *, require_model: bool = True, ollama: bool = False) -> Peeked:
    """Validate the routing fields; raise ``ApiError`` 400 in OpenAI's words otherwise.

    JSON nested deeper than ``foreign.MAX_DEPTH`` levels is a 400 too, refused
    before the decoder recurses (``ktd.foreign``): it is the client's input, never
    the frontend's 500. ``ollama``: Ollama's ``stream`` (see ``ollama_stream``).
    """
    if not body.strip():
        raise unreadable("We could not parse the JSON body of your request: the body is empty.")
    try:
        head = foreign.json(body, _decoder)
    except msgspec.ValidationError:
        # Only possible cause with Any-typed fields: the top level is not an object.
        raise unreadable("The JSON body of your request must be an object.") from None
    except foreign.TooDeep as exc:
        raise too_deep(exc) from None
    except msgspec.DecodeError as exc:
        raise unreadable(f"We could not parse the JSON body of your request: {exc}") from None
    stream = ollama_stream(head.stream) if ollama else _stream(head.stream)
    if head.model is msgspec.UNSET or head.model is None:
        if not require_model:
            return Peeked(model=None, stream=stream)
        raise errors.make(
            "bad_request", message="you must provide a model parameter", param="model"
        )
    if not isinstance(head.model, str):
        raise errors.make(
            "bad_request",
            message=f"Invalid type for 'model': expected a string, got {_json_type(head.model)}.",
            param="model",
            code="invalid_type",
        )
    return Peeked(model=check_model(head.model), stream=stream)


def too_deep(exc: foreign.TooDeep) -> errors.ApiError:
    """The 400 for a JSON body nested deeper than ktd decodes, on every route."""
    return unreadable(f"The JSON body of your request is nested too deeply: {exc}.")


def unreadable(message: str, code: str = "invalid_json") -> errors.ApiError:
    """The 400 for a body that cannot be read as its route's kind says so: JSON that
    does not parse (``invalid_json``), a form that is not one (``invalid_body``)."""
    return errors.make("bad_request", message=message, code=code)


def check_model(model: str) -> str:
    """A model name fit to route by: not empty, not absurdly long, no control characters."""
    if not model:
        raise errors.make("bad_request", message="'model' must not be empty", param="model")
    problem = p.name_problem(model)
    if problem is not None:
        raise errors.make(
            "bad_request", message=f"'model' {problem}.", param="model", code="invalid_model"
        )
    return model


def _stream(value: Any) -> bool:
    if value is None or value is msgspec.UNSET:
        return False
    if isinstance(value, bool):
        return value
    raise errors.make(
        "bad_request",
        message=f"Invalid type for 'stream': expected a boolean, got {_json_type(value)}.",
        param="stream",
        code="invalid_type",
    )


_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def ollama_stream(value: Any) -> bool:
    """Whether SGLang answers an Ollama request with an NDJSON stream.

    Its pydantic models say ``stream: bool = True``: absent means a stream, and
    pydantic's lax booleans count (``0``, ``"no"``, ``"false"``... are false). A
    value it refuses gets its 400, whatever is decided here, so no 400 of ours.
    """
    if value is msgspec.UNSET or value is True:
        return True
    if value is False or (isinstance(value, int | float) and value == 0):
        return False
    return not (isinstance(value, str) and value.strip().lower() in _FALSE)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def check_declared_length(content_length: int | None, limit: int) -> None:
    """Refuse an over-limit body from its Content-Length, before reading a byte of it."""
    if limit and content_length is not None and content_length > limit:
        raise errors.make("body_too_large", limit=limit)


async def read_limited(
    chunks: AsyncIterable[bytes],
    limit: int,
    *,
    drain_bytes: int = 4 << 20,
    drain_seconds: float = 1.0,
) -> bytes:
    """Collect the body, counting as it arrives (Content-Length may be absent or lie).

    ``limit`` 0 means no limit. Past the limit, up to ``drain_bytes`` more are
    read and dropped (for at most ``drain_seconds``) before the 413: a client
    still writing its body would otherwise miss the answer, and Hypercorn's
    per-request queue can stall on body events nobody reads any more.
    """
    parts: list[bytes] = []
    size = 0
    iterator = aiter(chunks)
    async for chunk in iterator:
        size += len(chunk)
        if limit and size > limit:
            drained = 0
            with trio.move_on_after(drain_seconds):
                async for extra in iterator:
                    drained += len(extra)
                    if drained > drain_bytes:
                        break
            raise errors.make("body_too_large", limit=limit)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)
