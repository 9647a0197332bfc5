"""The request body's first reading (``ktd.frontend.body``): model and stream only, its bounds."""

from __future__ import annotations

import json

import msgspec
import pytest

from ktd.frontend.body import check_declared_length, ollama_stream, parse_head, read_limited
from ktd.frontend.errors import ApiError


def test_parse_head_reads_only_model_and_stream() -> None:
    body = (
        b'{"messages": [{"role": "user", "content": "hi"}], "model": "m",'
        b' "stream": true, "x": {"y": [1,2]}}'
    )
    head = parse_head(body)
    assert head.model == "m"
    assert head.stream is True
    assert parse_head(b'{"model": "m"}').stream is False
    assert parse_head(b'{"model": "m", "stream": null}').stream is False


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"", None, "empty"),
        (b"{not json", None, "parse"),
        (b"[1, 2]", None, "object"),
        (b'"model"', None, "object"),
        (b"{}", "model", "must provide a model"),
        (b'{"model": null}', "model", "must provide a model"),
        (b'{"model": 3}', "model", "expected a string"),
        (b'{"model": ["a"]}', "model", "expected a string"),
        (b'{"model": ""}', "model", "empty"),
        (b'{"model": "m", "stream": "yes"}', "stream", "boolean"),
        (b'{"model": "m"', None, "parse"),
        (b"\xff\xfe", None, "parse"),
    ],
)
def test_parse_head_rejects_with_400(body: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_head(body)
    err = info.value
    assert err.status == 400
    assert err.param == param
    assert fragment in err.message
    shape = json.loads(err.body())
    assert set(shape["error"]) == {"message", "type", "param", "code"}
    assert shape["error"]["type"] == "invalid_request_error"


def test_declared_length_check() -> None:
    check_declared_length(None, 10)
    check_declared_length(10, 10)
    check_declared_length(10**9, 0)  # 0 = unlimited
    with pytest.raises(ApiError) as info:
        check_declared_length(11, 10)
    assert info.value.status == 413


async def test_read_limited_counts_while_reading() -> None:
    async def chunks(n: int, size: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield b"x" * size

    assert await read_limited(chunks(3, 4), 12) == b"x" * 12
    assert await read_limited(chunks(1, 4), 0) == b"xxxx"
    with pytest.raises(ApiError) as info:
        await read_limited(chunks(4, 4), 12)
    assert info.value.status == 413


def test_parse_head_optional_model_and_depth() -> None:
    assert parse_head(b'{"text": "x"}', require_model=False).model is None
    with pytest.raises(ApiError) as err:
        parse_head(b'{"text": "x"}')
    assert err.value.status == 400
    with pytest.raises(ApiError) as err:
        parse_head(b'{"model": "m", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert err.value.status == 400 and "nested too deeply" in err.value.message


@pytest.mark.parametrize(
    ("raw", "stream"),
    [
        (b'{"model": "m"}', True),  # SGLang's pydantic default
        (b'{"model": "m", "stream": false}', False),
        (b'{"model": "m", "stream": 0}', False),
        (b'{"model": "m", "stream": "No"}', False),
        (b'{"model": "m", "stream": "yes"}', True),
        (b'{"model": "m", "stream": null}', True),  # SGLang's 400 decides, not ours
    ],
)
def test_ollama_stream_reads_as_pydantic_does(raw: bytes, stream: bool) -> None:
    assert parse_head(raw, ollama=True).stream is stream
    assert ollama_stream(msgspec.UNSET) is True
