"""The sans-IO HTTP/1.1 client codec (ktd.frontend.h1): bytes in, events out, no sockets."""

from __future__ import annotations

import pytest

from ktd.frontend.h1 import (
    END,
    MAX_CHUNK_LINE,
    MAX_HEAD,
    NEED_DATA,
    BrokenResponse,
    Event,
    Head,
    IncompleteMessage,
    Interim,
    ResponseParser,
    build_request,
)

HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def drain(parser: ResponseParser) -> list[Event]:
    """Every event the buffered bytes give, up to NEED_DATA or END (not included)."""
    out: list[Event] = []
    while (event := parser.next_event()) is not NEED_DATA and event is not END:
        out.append(event)
    if event is END:
        out.append(END)
    return out


def run(
    pieces: list[bytes], *, eof: bool = False, method: bytes = b"POST"
) -> tuple[ResponseParser, list[Event]]:
    """Feed ``pieces`` one by one (then EOF if asked); the parser and every event."""
    parser = ResponseParser(method)
    events: list[Event] = []
    for piece in pieces:
        parser.feed(piece)
        events += drain(parser)
    if eof:
        parser.feed(b"")
        events += drain(parser)
    return parser, events


def body_of(events: list[Event]) -> bytes:
    return b"".join(e for e in events if isinstance(e, bytes))


def byte_at_a_time(raw: bytes) -> list[bytes]:
    return [raw[i : i + 1] for i in range(len(raw))]


SSE = [b"data: a\n\n", b'data: {"x": "bb"}\n\n', b"data: [DONE]\n\n"]


# ---------------------------------------------------------------- chunked


@pytest.mark.parametrize("split", ["whole", "bytes", "every-cut"])
def test_chunked_body_at_any_split(split: str) -> None:
    raw = HEAD_CHUNKED + chunked(*SSE)
    if split == "whole":
        cases = [[raw]]
    elif split == "bytes":
        cases = [byte_at_a_time(raw)]
    else:
        cases = [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    for pieces in cases:
        parser, events = run(pieces)
        assert isinstance(events[0], Head) and events[0].status == 200
        assert events[-1] is END
        assert body_of(events) == b"".join(SSE)
        assert parser.complete and parser.keep_alive


def test_chunks_that_arrived_together_come_out_as_one_bytes() -> None:
    parser = ResponseParser()
    parser.feed(HEAD_CHUNKED + chunked(*SSE))
    assert isinstance(parser.next_event(), Head)
    data = parser.next_event()
    assert data == b"".join(SSE)
    # The terminator was consumed with the data: complete before END is asked for.
    assert parser.complete and parser.next_event() is END
    assert parser.next_event() is END


def test_after_body_data_nothing_is_left_to_decode_until_more_is_fed() -> None:
    """What Response.receive relies on to skip a decode call per chunk."""
    raw = HEAD_CHUNKED + b"9\r\ndata: one\r\n" + b"5\r\ndat"
    parser = ResponseParser()
    parser.feed(raw)
    assert isinstance(parser.next_event(), Head)
    assert parser.next_event() == b"data: onedat"
    assert parser.next_event() is NEED_DATA
    parser.feed(b"a:\r\n0\r\n\r\n")
    assert parser.next_event() == b"a:"
    assert parser.complete


def test_chunk_extensions_and_uppercase_hex_are_accepted() -> None:
    body = b"A;name=value\r\n0123456789\r\n3 ; x\r\nabc\r\n0;last\r\n\r\n"
    parser, events = run([HEAD_CHUNKED + body])
    assert body_of(events) == b"0123456789abc"
    assert parser.keep_alive


def test_trailers_are_parsed_and_kept() -> None:
    raw = HEAD_CHUNKED + b"2\r\nhi\r\n0\r\nx-checksum: 1\r\nx-other:  two \r\n\r\n"
    for pieces in ([raw], byte_at_a_time(raw)):
        parser, events = run(pieces)
        assert body_of(events) == b"hi"
        assert parser.trailers == [(b"x-checksum", b"1"), (b"x-other", b"two")]
        assert parser.complete and parser.keep_alive


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n",  # not hex
        b"\r\nhello\r\n",  # empty size
        b"-5\r\nhello\r\n",
        b"+5\r\nhello\r\n",  # int() would take it
        b"0x5\r\nhello\r\n",  # int(..., 16) would take it
        b"5 5\r\nhello\r\n",
        b"1_0\r\n",  # int() would take it
        b"11111111111111111\r\n",  # 17 digits
        b"5\r\nhelloXY",  # no CRLF after the data
        b"5\r\nhello\n0\r\n\r\n",
    ],
)
def test_bad_chunked_framing_is_a_protocol_error(body: bytes) -> None:
    parser = ResponseParser()
    parser.feed(HEAD_CHUNKED + body)
    assert isinstance(parser.next_event(), Head)
    with pytest.raises(BrokenResponse):
        drain(parser)


def test_bad_chunk_size_reports_the_size() -> None:
    parser = ResponseParser()
    parser.feed(HEAD_CHUNKED + b"zz\r\n")
    parser.next_event()
    with pytest.raises(BrokenResponse, match="chunk size"):
        parser.next_event()


def test_chunk_size_line_without_end_is_bounded() -> None:
    parser = ResponseParser()
    parser.feed(HEAD_CHUNKED)
    parser.next_event()
    parser.feed(b"1;" + b"x" * (MAX_CHUNK_LINE - 10))
    assert parser.next_event() is NEED_DATA
    parser.feed(b"x" * 20)
    with pytest.raises(BrokenResponse, match="too long"):
        parser.next_event()


def test_oversized_trailers_are_refused() -> None:
    parser = ResponseParser()
    parser.feed(HEAD_CHUNKED + b"0\r\n")
    parser.next_event()
    with pytest.raises(BrokenResponse, match="trailers"):
        for _ in range(MAX_HEAD // 100 + 2):
            parser.feed(b"x-t: " + b"v" * 93 + b"\r\n")
            drain(parser)


def test_eof_inside_a_chunked_body_is_incomplete() -> None:
    parser, events = run([HEAD_CHUNKED + b"9\r\ndata: one\r\n5\r\ndata:\r\n"])
    assert body_of(events) == b"data: onedata:"
    parser.feed(b"")
    with pytest.raises(IncompleteMessage):
        parser.next_event()
    assert not parser.keep_alive


# ---------------------------------------------------------------- other framings


def test_content_length_body_returns_the_bytes_fed_without_copying() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\nx-a: 1\r\n\r\n")
    head = parser.next_event()
    assert isinstance(head, Head) and head.status == 400 and head.reason == b"Bad Request"
    assert (b"x-a", b"1") in head.headers
    piece = b"01234"
    parser.feed(piece)
    assert parser.next_event() is piece
    assert parser.next_event() is NEED_DATA
    parser.feed(b"56789")
    assert parser.next_event() == b"56789"
    assert parser.complete and parser.keep_alive and parser.next_event() is END


def test_content_length_byte_at_a_time() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    parser, events = run(byte_at_a_time(raw))
    assert body_of(events) == b"hello"
    assert parser.keep_alive


def test_bytes_after_the_response_make_the_connection_unusable() -> None:
    """We never pipeline: anything after the end is the server misbehaving."""
    for raw in (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
        HEAD_CHUNKED + chunked(b"ok") + b"HTTP/1.1 200 OK\r\n",
    ):
        parser, events = run([raw])
        assert body_of(events) == b"ok"
        assert parser.complete and not parser.keep_alive
        assert parser.buffered > 0


def test_eof_inside_a_content_length_body_is_incomplete() -> None:
    parser, _ = run([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf"])
    parser.feed(b"")
    with pytest.raises(IncompleteMessage):
        parser.next_event()


def test_body_without_length_is_read_until_close() -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nsome"
    parser, events = run([raw, b" more"], eof=True)
    assert body_of(events) == b"some more" and events[-1] is END
    assert parser.complete and not parser.keep_alive


def test_transfer_coding_other_than_chunked_is_read_until_close() -> None:
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\nabcdef"
    parser, events = run([raw], eof=True)
    assert body_of(events) == b"abcdef"
    assert not parser.keep_alive


def test_chunked_wins_over_content_length() -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: chunked\r\n\r\n"
    parser, events = run([raw + chunked(b"abc")])
    assert body_of(events) == b"abc"
    assert parser.complete


@pytest.mark.parametrize("status", [204, 304])
def test_no_body_statuses(status: int) -> None:
    parser, events = run([b"HTTP/1.1 %d X\r\ncontent-length: 12\r\n\r\n" % status])
    assert events[-1] is END and parser.complete and parser.keep_alive


def test_head_request_has_no_body_whatever_the_length_says() -> None:
    parser, _ = run([b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n"], method=b"HEAD")
    assert parser.complete and parser.keep_alive
    assert parser.next_event() is END


def test_interim_responses_come_before_the_final_one() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    for pieces in ([raw], byte_at_a_time(raw)):
        _, events = run(pieces)
        assert [type(e) for e in events[:3]] == [Interim, Interim, Head]
        assert events[1].headers == [(b"link", b"</x>")]
        assert body_of(events) == b"ok"


def test_101_is_refused() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n")
    with pytest.raises(BrokenResponse, match="101"):
        parser.next_event()


# ---------------------------------------------------------------- keep-alive


@pytest.mark.parametrize(
    ("head", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n", False),
    ],
)
def test_keep_alive_decision(head: bytes, keep: bool) -> None:
    parser, _ = run([head])
    assert parser.complete and parser.keep_alive is keep


def test_keep_alive_is_false_until_complete() -> None:
    parser, _ = run([b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab"])
    assert not parser.complete and not parser.keep_alive


# ---------------------------------------------------------------- malformed heads


@pytest.mark.parametrize(
    "line",
    [
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 +20 OK",
        b"HTTP/1.1 abc OK",
        b"HTTP/1.1 099 OK",
        b"HTTP/1.1",
        b"ICY 200 OK",
        b"",
        b"HTTP/1.1 200 OK\nx: y",
    ],
)
def test_bad_status_line(line: bytes) -> None:
    parser = ResponseParser()
    parser.feed(line + b"\r\n\r\n")
    with pytest.raises(BrokenResponse):
        parser.next_event()


def test_status_line_without_reason_is_fine() -> None:
    head = run([b"HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n"])[1][0]
    assert isinstance(head, Head) and head.status == 200 and head.reason == b""


@pytest.mark.parametrize(
    "field",
    [
        b"no-colon",
        b": empty-name",
        b"bad name: x",
        b"name : x",
        b" folded: x",
        b"x: a\rb",
        b"x: a\x00b",
    ],
)
def test_bad_header_line(field: bytes) -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n" + field + b"\r\ncontent-length: 0\r\n\r\n")
    with pytest.raises(BrokenResponse, match="header"):
        parser.next_event()


@pytest.mark.parametrize("value", [b"abc", b"-1", b"+1", b"1, 2", b"1 2", b"", b"9" * 19])
def test_bad_content_length(value: bytes) -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: " + value + b"\r\n\r\n")
    with pytest.raises(BrokenResponse, match="content-length"):
        parser.next_event()


def test_repeated_equal_content_lengths_are_one() -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nContent-Length: 2, 2\r\n\r\nok"
    assert body_of(run([raw])[1]) == b"ok"


def test_oversized_head_is_refused_without_its_end() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    assert parser.next_event() is NEED_DATA
    with pytest.raises(BrokenResponse, match="too large"):
        for _ in range(MAX_HEAD // 1000 + 2):
            parser.feed(b"x-pad: " + b"p" * 991 + b"\r\n")
            parser.next_event()


def test_oversized_head_is_refused_with_its_end() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * MAX_HEAD + b"\r\n\r\n")
    with pytest.raises(BrokenResponse, match="too large"):
        parser.next_event()


def test_eof_before_or_inside_the_head() -> None:
    parser = ResponseParser()
    parser.feed(b"")
    with pytest.raises(IncompleteMessage, match="before any"):
        parser.next_event()
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    parser.feed(b"")
    with pytest.raises(IncompleteMessage, match="inside"):
        parser.next_event()


def test_feeding_after_eof_is_a_caller_bug() -> None:
    parser = ResponseParser()
    parser.feed(b"")
    with pytest.raises(RuntimeError):
        parser.feed(b"x")


# ---------------------------------------------------------------- requests


def test_build_request() -> None:
    head = build_request(
        b"POST", b"/v1/chat/completions?x=1", b"127.0.0.1:30000", [(b"x-request-id", b"r1")], 8
    )
    assert head == (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:30000\r\n"
        b"content-length: 8\r\naccept-encoding: identity\r\nx-request-id: r1\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        (b"POST", b"/x", [(b"x-a", b"1\r\nx-forged: 2")]),
        (b"POST", b"/x", [(b"x-a\n", b"1")]),
        (b"POST", b"/x", [(b"x-a", b"1\r")]),
        (b"POST", b"/x HTTP/1.1\r\nx:", []),
        (b"POST", b"/a b", []),
        (b"PO ST", b"/x", []),
    ],
)
def test_build_request_refuses_injection(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    with pytest.raises(ValueError):
        build_request(method, target, b"h:1", headers, 0)
