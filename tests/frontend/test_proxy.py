"""The proxy's pure parts (``ktd.frontend.proxy``): headers passed on, the stream's comments."""

from __future__ import annotations

from ktd.frontend.proxy import forward_headers, loading_comment


def test_forward_headers_drops_credentials_and_hop_by_hop() -> None:
    raw = [
        (b"Host", b"x"),
        (b"Content-Type", b"application/x-www-form-urlencoded"),
        (b"Content-Length", b"12"),
        (b"Authorization", b"Bearer sk-secret"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"X-Hop", b"1"),
        (b"Accept", b"text/event-stream"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Accept-Encoding", b"gzip"),
        (b"X-Request-Id", b"abc"),
    ]
    kept = dict(forward_headers(raw))
    assert kept == {
        b"content-type": b"application/json",
        b"accept": b"text/event-stream",
        b"x-request-id": b"abc",
    }


def test_loading_comment_is_an_sse_comment() -> None:
    assert loading_comment("m", 4.7) == b": loading m 4s\n\n"
    assert loading_comment("m\n\ndata: x", 0) == b": loading mdata: x 0s\n\n"
    assert loading_comment("m", 12.2, 300.4) == b": loading m 12s of ~300s expected\n\n"
    assert loading_comment("m", 2.5, verb="waking") == b": waking m 2s\n\n"
