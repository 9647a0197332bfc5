"""The request helper every route uses: headers, bodies within bounds, errors in shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from ktd.core.keys import bearer
from ktd.frontend import errors
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import (
    DRAIN_BYTES,
    Disconnected,
    drain,
    drained,
    header,
    headers,
    may_have_body,
    read_body,
    read_body_in_time,
    send_error,
)


def scope(*pairs: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "headers": list(pairs)}


def feed(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if not queue:
            await trio.sleep_forever()
        return queue.pop(0)

    return receive


def part(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


def test_headers_are_found_by_lowercase_name_in_order() -> None:
    s = scope((b"X-Ktd-Model", b"m1"), (b"cookie", b"a=1"), (b"Cookie", b"b=2"))
    assert header(s, b"x-ktd-model") == b"m1"
    assert headers(s, b"cookie") == [b"a=1", b"b=2"]
    assert header(s, b"host") is None


def test_a_body_is_there_when_framing_says_so() -> None:
    assert may_have_body(scope((b"Content-Length", b" 12 ")))
    assert may_have_body(scope((b"transfer-encoding", b"chunked")))
    assert not may_have_body(scope((b"content-length", b"0")))
    assert not may_have_body(scope())


def test_the_bearer_token_whatever_the_scheme_s_case() -> None:
    assert bearer(b"Bearer sk-1") == b"sk-1"
    assert bearer("bearer  sk-\u00e9 ") == "sk-\u00e9".encode()
    assert bearer(b"Basic sk-1") is None and bearer(b"Bearer ") is None and bearer(None) is None


async def test_bodies_are_read_whole_within_their_bounds() -> None:
    assert await read_body(feed(part(b"{}")), 10) == b"{}"
    assert await read_body(feed(part(b"ab", True), part(b"cd")), 10) == b"abcd"
    with pytest.raises(ApiError) as big:
        await read_body(feed(part(b"x" * 8, True), part(b"x" * 8)), 10)
    assert big.value.status == 413
    with pytest.raises(Disconnected):
        await read_body(feed(part(b"ab", True), {"type": "http.disconnect"}), 10)
    with pytest.raises(ApiError) as slow:
        await read_body_in_time(feed(part(b"ab", True)), 10, 0.05)
    assert slow.value.status == 408


async def test_drain_reports_whether_the_rest_ended_within_bounds() -> None:
    assert await drain(feed(part(b"x" * 5, True), part(b"y")), 100, 1.0)
    assert not await drain(feed(part(b"x" * 50, True), part(b"y" * 60)), 100, 1.0)
    assert not await drain(feed({"type": "http.disconnect"}), 100, 1.0)
    assert not await drain(feed(part(b"x", True)), 100, 0.05)


async def test_a_request_is_drained_only_if_it_has_a_body_and_within_the_bounds() -> None:
    bodiless = {"headers": [(b"host", b"x")]}
    assert await drained(bodiless, feed())  # nothing to read: no receive at all
    sized = {"headers": [(b"content-length", b"3")]}
    assert await drained(sized, feed(part(b"abc")))
    too_big = part(b"x" * (DRAIN_BYTES + 1))
    assert not await drained({"headers": [(b"transfer-encoding", b"chunked")]}, feed(too_big))


async def test_errors_go_out_in_the_route_s_shape() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    err = errors.make("key_busy", message="one at a time", retry_after=1)
    await send_error(send, err, close=True, extra=[(b"x-extra", b"1")])
    start, body = sent
    got = dict(start["headers"])
    assert start["status"] == 429 and got[b"connection"] == b"close"
    assert got[b"retry-after"] == b"1" and got[b"x-extra"] == b"1"
    assert json.loads(body["body"])["error"]["message"] == "one at a time"
    sent.clear()
    await send_error(send, err, ollama=True)
    assert json.loads(sent[1]["body"]) == {"error": "one at a time"}
