"""Sans-IO HTTP/1.1 client codec: request bytes out, response events in.

Why a codec apart from the sockets (upstream.py): framing is where the bugs
hide (a chunk size cut in two reads, trailers, a server that closes to end a
body), and a parser that only sees bytes can be tested at every byte boundary
without a socket or a clock. It does no I/O and never blocks: ``feed`` it what
arrived (``b""`` for EOF) and ask ``next_event`` what that means.

Events: ``Interim`` (a 1xx, the real answer follows), ``Head`` (status line and
headers), body data as plain ``bytes``, ``END``, or ``NEED_DATA``. Body data is
bare ``bytes`` rather than an event object on purpose: the proxy relays one of
these per chunk, and wrapping each in an object would cost an allocation per
chunk for nothing. For the same reason one call decodes *everything* that is
buffered (chunks that arrived together come out as one ``bytes``), consumes
the framing that follows (a chunk's CRLF, the last chunk, trailers), and so
``complete`` is already true when the data that ended the body is returned:
the relay can mark its last message final without another round trip.

Copies: a read that holds whole body bytes at the start of the buffer is
returned as is (CPython's full slice of ``bytes`` is the object itself); a
chunked read costs one slice per chunk, and a join only when several chunks
arrived together.

Only what an engine hop needs is here: no pipelining (one response per parser;
bytes after it make the connection unusable, see ``keep_alive``), no upgrades
(a 101 is an error: we never ask for one), no content codings.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

MAX_HEAD: Final = 64 * 1024  # status line + headers; also the bound on trailers
MAX_CHUNK_LINE: Final = 4096  # chunk size + extensions
_HEX: Final = b"0123456789abcdefABCDEF"


class BrokenResponse(Exception):
    """The server broke HTTP/1.1: nothing more on this connection can be trusted."""


class IncompleteMessage(BrokenResponse):
    """EOF before the response was complete (the server closed or died)."""


class Signal(enum.Enum):
    """The two events that carry no data (singletons: compared with ``is``)."""

    NEED_DATA = "need data"
    END = "end of message"


NEED_DATA: Final = Signal.NEED_DATA
END: Final = Signal.END


@dataclass(frozen=True, slots=True)
class Interim:
    """A 1xx response (100 Continue, 103 Early Hints): the final one follows."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Head:
    """The final response's status line and headers (names lower-cased, values stripped)."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]


Event = Interim | Head | bytes | Signal

# Parser states. Body states first: next_event tests them in this order.
_CHUNKED: Final = 0
_LENGTH: Final = 1
_UNTIL_CLOSE: Final = 2
_HEAD: Final = 3
_DONE: Final = 4

# Chunked sub-states
_SIZE: Final = 0
_DATA: Final = 1
_CRLF: Final = 2
_TRAILER: Final = 3


def _size_field(line: bytes) -> bytes:
    """The size of a chunk-size line that is not bare hex: the part before its extensions
    (allowed, ignored), else ``BrokenResponse``. Off the per-chunk path: SGLang's chunks
    carry no extensions, so their lines are bare hex and never come here."""
    size = line.partition(b";")[0].rstrip(b" \t") if b";" in line else b""
    if not size or len(size) > 16 or size.strip(_HEX):
        raise BrokenResponse(f"bad chunk size: {line[:20]!r}")
    return size


def build_request(
    method: bytes,
    target: bytes,
    netloc: bytes,
    headers: Iterable[tuple[bytes, bytes]],
    content_length: int,
) -> bytes:
    """The request head; the body (``content_length`` bytes) is sent after it as is.

    Content-Length is always sent (0 for a GET), so the server never has to
    guess; ``accept-encoding: identity`` keeps bytes passing through verbatim.
    A CR or LF in a name or value would let a header forge the rest of the
    request: refused (ValueError), whatever the caller checked before.
    """
    lines = [method, b" ", target, b" HTTP/1.1\r\nhost: ", netloc]
    lines.append(b"\r\ncontent-length: ")
    lines.append(b"%d" % content_length)
    lines.append(b"\r\naccept-encoding: identity")
    breaks = 5  # after the request line, host, content-length, and the blank line's two
    for name, value in headers:
        lines += (b"\r\n", name, b": ", value)
        breaks += 1
    lines.append(b"\r\n\r\n")
    head = b"".join(lines)
    if head.count(b"\r") != breaks or head.count(b"\n") != breaks:
        raise ValueError("CR or LF inside the request line or a header")
    if b" " in target or not method.isalpha():
        raise ValueError(f"bad request line: {method!r} {target!r}")
    return head


class ResponseParser:
    """The state of one response on the wire; make a new one per request.

    ``method`` matters: a HEAD response announces a length it does not send.
    """

    __slots__ = (
        "_buf",
        "_chunk",
        "_close",
        "_eof",
        "_method",
        "_pos",
        "_remaining",
        "_scanned",
        "_state",
        "_trailer_bytes",
        "complete",
        "head",
        "trailers",
    )

    def __init__(self, method: bytes = b"POST") -> None:
        self._method = method
        self._buf = b""
        self._pos = 0
        self._state = _HEAD
        self._chunk = _SIZE
        self._remaining = 0
        self._eof = False
        self._close = False
        self._scanned = 0  # head bytes already searched for the blank line
        self._trailer_bytes = 0
        self.complete = False  # the whole response is parsed (END is next)
        self.head: Head | None = None
        self.trailers: list[tuple[bytes, bytes]] = []

    # ------------------------------------------------------------ input

    def feed(self, data: bytes) -> None:
        """Bytes as they arrived; ``b""`` means the server closed (EOF)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("data fed after EOF")
        pos = self._pos
        if pos == len(self._buf):
            self._buf = data  # the common case: nothing left over, no copy
        else:  # a cut chunk line or head: at most MAX_HEAD bytes carried over
            self._buf = self._buf[pos:] + data
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet consumed (after END: bytes the response did not own)."""
        return len(self._buf) - self._pos

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request after this response.

        Only a complete response, that neither asked to close (``Connection:
        close``, HTTP/1.0) nor needed the close to end its body, and that was
        followed by nothing: bytes after the end are not ours to interpret.
        """
        return self.complete and not self._close and self._pos == len(self._buf)

    # ------------------------------------------------------------ events

    def next_event(self) -> Event:
        """What the buffered bytes amount to next; raises BrokenResponse on a broken response.

        After a body ``bytes``, everything buffered has been consumed that
        could be: the next call returns END (``complete``) or NEED_DATA,
        unless more is fed.
        """
        state = self._state
        if state == _CHUNKED:
            return self._chunked()
        if state == _LENGTH:
            return self._length()
        if state == _UNTIL_CLOSE:
            return self._until_close()
        if state == _HEAD:
            return self._head()
        return END

    # ------------------------------------------------------------ bodies

    def _chunked(self) -> Event:
        """A chunked body: what the buffer holds of the chunks' data, joined (once per
        relayed chunk: locals, not attributes, in the loop)."""
        buf = self._buf
        pos = self._pos
        end = len(buf)
        out: bytes | None = None
        parts: list[bytes] | None = None
        sub = self._chunk
        while pos < end:
            if sub == _DATA:
                remaining = self._remaining
                if end - pos < remaining:
                    piece = buf[pos:]
                    self._remaining = remaining - (end - pos)
                    pos = end
                else:
                    piece = buf[pos : pos + remaining]
                    pos += remaining
                    sub = _CRLF
                if out is None:
                    out = piece
                elif parts is None:
                    parts = [out, piece]
                else:
                    parts.append(piece)
            elif sub == _CRLF:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                    sub = _SIZE
                elif end - pos >= 2 or buf[pos] != 13:
                    raise BrokenResponse("chunk data not followed by CRLF")
                else:
                    break
            elif sub == _SIZE:
                i = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
                if i < 0:
                    if end - pos >= MAX_CHUNK_LINE:
                        raise BrokenResponse("chunk size line too long")
                    break
                line = buf[pos:i]
                if not line or len(line) > 16 or line.strip(_HEX):
                    line = _size_field(line)  # not bare hex: extensions, or not a size
                pos = i + 2
                size = int(line, 16)
                self._remaining = size
                sub = _DATA if size else _TRAILER
            else:  # trailer fields until an empty line
                pos = self._trailers(buf, pos)
                break
        self._chunk = sub
        if pos == end:
            self._buf = b""
            self._pos = 0
        else:
            self._pos = pos
        if out is not None:
            return out if parts is None else b"".join(parts)
        return self._no_chunk_data()

    def _no_chunk_data(self) -> Event:
        """No chunk data buffered: the end once the last chunk and trailers are in, else
        more to wait for, unless the server closed. Apart from ``_chunked``'s loop because
        the relay never asks for it mid-stream (its feeds each bring data)."""
        if self.complete:
            return END
        if self._eof:
            raise IncompleteMessage("EOF inside a chunked body")
        return NEED_DATA

    def _trailers(self, buf: bytes, pos: int) -> int:
        """Trailer fields from ``pos`` up to the empty line that ends the body (then
        complete), or as far as the buffer goes; where parsing stopped."""
        end = len(buf)
        while True:
            i = buf.find(b"\r\n", pos)
            if i < 0:
                if self._trailer_bytes + end - pos > MAX_HEAD:
                    raise BrokenResponse("trailers too large")
                return pos
            if i == pos:
                self._state = _DONE
                self.complete = True
                return pos + 2
            self._trailer_bytes += i + 2 - pos
            if self._trailer_bytes > MAX_HEAD:
                raise BrokenResponse("trailers too large")
            self.trailers.append(_parse_field(buf[pos:i]))
            pos = i + 2

    def _length(self) -> Event:
        """A Content-Length body: what is buffered, up to what is left of it."""
        buf = self._buf
        pos = self._pos
        n = len(buf) - pos
        if not n:
            if self._eof:
                raise IncompleteMessage("EOF inside a Content-Length body")
            return NEED_DATA
        remaining = self._remaining
        if n < remaining:
            self._remaining = remaining - n
            self._buf = b""
            self._pos = 0
            return buf[pos:]
        self._remaining = 0
        self._pos = pos + remaining
        self._state = _DONE
        self.complete = True
        if self._pos == len(buf):
            self._buf = b""
            self._pos = 0
        return buf[pos : pos + remaining]

    def _until_close(self) -> Event:
        """A body delimited by the close of the connection (HTTP/1.0 style)."""
        buf = self._buf
        pos = self._pos
        if pos < len(buf):
            self._buf = b""
            self._pos = 0
            return buf[pos:]
        if self._eof:
            self._state = _DONE
            self.complete = True
            return END
        return NEED_DATA

    # ------------------------------------------------------------ head

    def _head(self) -> Event:
        buf = self._buf
        pos = self._pos
        start = pos + max(0, self._scanned - 3)
        end = buf.find(b"\r\n\r\n", start)
        if end < 0:
            if len(buf) - pos > MAX_HEAD:
                raise BrokenResponse("response head too large")
            self._scanned = len(buf) - pos
            if self._eof:
                if pos == len(buf):
                    raise IncompleteMessage("EOF before any response")
                raise IncompleteMessage("EOF inside the response head")
            return NEED_DATA
        if end - pos > MAX_HEAD:
            raise BrokenResponse("response head too large")
        self._pos = end + 4
        self._scanned = 0
        status, reason, http10, headers = _parse_head(buf[pos:end])
        if status < 200:
            if status == 101:
                raise BrokenResponse("101 Switching Protocols, but no upgrade was asked for")
            return Interim(status, reason, headers)
        head = Head(status, reason, headers)
        self.head = head
        self._frame(status, http10, headers)
        if self._pos == len(buf):
            self._buf = b""
            self._pos = 0
        return head

    def _frame(self, status: int, http10: bool, headers: list[tuple[bytes, bytes]]) -> None:
        """Body framing (RFC 9112 6.3) and whether the connection survives the response."""
        te: list[bytes] = []
        lengths: list[bytes] = []
        close = http10
        for name, value in headers:
            if name == b"transfer-encoding":
                te.append(value)
            elif name == b"content-length":
                lengths.append(value)
            elif name == b"connection" and b"close" in _tokens(value):
                close = True
        self._close = close
        if self._method == b"HEAD" or status in (204, 304):
            self._done()
        elif te:
            codings = _tokens(b",".join(te))
            if codings and codings[-1] == b"chunked":
                self._state = _CHUNKED
            else:  # a response whose last coding is not chunked ends at EOF
                self._state = _UNTIL_CLOSE
                self._close = True
        elif lengths:
            found = {v.strip(b" \t") for value in lengths for v in value.split(b",")}
            value = found.pop() if len(found) == 1 else b""
            if not value.isdigit() or len(value) > 18:
                raise BrokenResponse(f"bad content-length: {b', '.join(lengths)[:40]!r}")
            self._remaining = int(value)
            if self._remaining:
                self._state = _LENGTH
            else:
                self._done()
        else:
            self._state = _UNTIL_CLOSE
            self._close = True

    def _done(self) -> None:
        self._state = _DONE
        self.complete = True


def _tokens(value: bytes) -> list[bytes]:
    return [t.strip(b" \t").lower() for t in value.split(b",") if t.strip(b" \t")]


def _parse_head(head: bytes) -> tuple[int, bytes, bool, list[tuple[bytes, bytes]]]:
    """(status, reason, is HTTP/1.0, headers) of a head without its blank line."""
    lines = head.split(b"\r\n")
    line = lines[0]
    version, sp, rest = line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if (
        not sp
        or version not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(code) != 3
        or not code.isdigit()
        or code[0] == 0x30
        or b"\r" in line
        or b"\n" in line
    ):
        raise BrokenResponse(f"bad status line: {line[:80]!r}")
    return int(code), reason, version == b"HTTP/1.0", [_parse_field(f) for f in lines[1:]]


def _parse_field(line: bytes) -> tuple[bytes, bytes]:
    """``name: value`` with the name lower-cased; obs-fold and stray CR/LF refused."""
    name, sep, value = line.partition(b":")
    if (
        not sep
        or not name
        or b" " in name
        or b"\t" in name
        or b"\r" in line
        or b"\n" in line
        or b"\0" in line
    ):
        raise BrokenResponse(f"bad header line: {line[:80]!r}")
    return name.lower(), value.strip(b" \t")
