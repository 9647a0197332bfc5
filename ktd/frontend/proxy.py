"""The per-request exchange with an engine, and the streaming relay.

The hot path is the chunk loop in ``relay``: receive bytes from the engine, hand
them to the server, nothing else (no parsing, no re-encoding, no per-chunk
bookkeeping; the first chunk is pulled out of the loop so time-to-first-byte
costs nothing per chunk). Whatever arrived together is forwarded as one ASGI
message, so under load one message carries several SSE events.
Everything per-request (headers, lease, metrics) is done once, before or after
the loop.

Cleanup is owned by ``Exchange.aclose``, which is idempotent and runs from the
request handler's ``finally`` however the request ends (normally, client gone,
server shutdown). It closes the upstream response (an unfinished one closes its
TCP connection, which is how SGLang learns to abort the generation) and then
leaves the request's slot on the claim (no message to the daemon: the claim
broker counts). Both are synchronous, so a cancellation cannot interrupt
them halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio

from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core.admission import ANYONE, KeyTerms
from ktd.frontend import errors
from ktd.frontend.broker import ClaimBroker
from ktd.frontend.errors import SSE_DONE, ApiError
from ktd.frontend.metrics import UNKNOWN_MODEL, Metrics
from ktd.frontend.slot import PendingAsk, Slot
from ktd.frontend.tally import Api, StreamTally, Tokens
from ktd.frontend.transport import ClientDeaf
from ktd.frontend.upstream import (
    ConnectFailed,
    Response,
    UpstreamError,
    UpstreamPool,
    UpstreamTimeout,
)

if TYPE_CHECKING:
    from ktd.frontend.waits import Ticket

log = logging.getLogger("ktd.frontend")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Give = Callable[[bytes, bool], Awaitable[None]]  # one body chunk, and whether more follow

# Request headers never forwarded to the engine: hop-by-hop (RFC 9110 7.6.1),
# ones the upstream client sets itself (upstream.py), and the client's
# credentials (the engine does not need the frontend's key, and must not see
# it). accept-encoding is dropped and pinned to identity so bytes pass through
# without content-coding surprises.
_DROP_REQUEST = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
        b"cookie",
        b"accept-encoding",
        b"expect",
        b"x-api-key",
        b"api-key",
        b"content-type",  # replaced: see forward_headers
    }
)

# Response headers not copied back: hop-by-hop, and ones the server recomputes.
_DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"date",
        b"server",
    }
)

# Error codes that prove the daemon knows the model name (so it may be a label).
_NAME_KNOWN = frozenset(
    {
        "engine_failed",
        "model_not_loaded",
        "load_timeout",
        "engine_busy",
        "upstream_error",
        "upstream_timeout",
    }
)

STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_STREAM_NAMES = frozenset(k for k, _ in STREAM_HEADERS)
SSE_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


def stream_headers(upstream: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers of a streamed answer: the engine's, with the no-buffering pair forced."""
    kept = [(k, v) for k, v in backward_headers(upstream) if k not in _STREAM_NAMES]
    if not any(k == b"content-type" for k, _ in kept):
        kept.append(SSE_CONTENT_TYPE)
    return kept + STREAM_HEADERS


def forward_headers(
    raw: Iterable[tuple[bytes, bytes]], content_type: bytes | None = b"application/json"
) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop, host, length and credentials.

    Content-Type is ``application/json`` for JSON routes: the body was just
    checked to be a JSON object, and SGLang refuses anything else with a 400
    that ``curl -d`` users (form-urlencoded by default) would not expect. Other
    bodies (multipart audio) keep the client's own ``content_type``.
    """
    connection_named: set[bytes] = set()
    kept: list[tuple[bytes, bytes]] = []
    if content_type:
        kept.append((b"content-type", content_type))
    for name, value in raw:
        lname = name.lower()
        if lname == b"connection":
            connection_named.update(v.strip().lower() for v in value.split(b","))
        if lname in _DROP_REQUEST:
            continue
        kept.append((lname, value))
    if connection_named:
        kept = [(n, v) for n, v in kept if n not in connection_named]
    return kept


def backward_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's response headers minus hop-by-hop ones and those the server sets."""
    return [(k, v) for k, v in headers if k not in _DROP_RESPONSE]


def control_error(model: str, exc: Exception) -> ApiError:
    """Map what the broker raises to the client-facing error."""
    if isinstance(exc, ControlError):
        return errors.from_control(model, exc.code, exc.message, exc.detail)
    return errors.make("daemon_unreachable", detail=str(exc))


class Exchange:
    """One proxied request: its slot on a claim, its upstream response, its metrics."""

    __slots__ = (
        "acquire",
        "adapter",
        "api",
        "body",
        "broker",
        "closed",
        "endpoint",
        "framing",
        "handle",
        "headers",
        "key",
        "label",
        "method",
        "metrics",
        "model",
        "on_usage",
        "pool",
        "progress",
        "remember",
        "response",
        "retry",
        "slot",
        "started",
        "status",
        "tally",
        "target",
        "tokens",
        "watch",
    )

    def __init__(
        self,
        *,
        broker: ClaimBroker,
        pool: UpstreamPool,
        metrics: Metrics,
        endpoint: str,
        model: str,
        target: bytes,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        started: float,
        acquire: Callable[[], Awaitable[PendingAsk]],
        key: KeyTerms = ANYONE,
        api: Api = "openai",
        tally: StreamTally | None = None,
        on_usage: Callable[[Exchange], None] | None = None,
        method: bytes = b"POST",
        adapter: str | None = None,
        framing: str = "sse",
        remember: Callable[[str, bytes], None] | None = None,
        progress: Callable[[float], Awaitable[bytes]] | None = None,
        watch: Ticket | None = None,
    ) -> None:
        self.broker = broker
        self.acquire = acquire  # asks for a slot on the flow's terms (``admit``)
        self.key = key  # the request's API key's terms (its name counts its usage)
        self.api = api  # whose shapes its answer has (where its usage is)
        self.tally = tally  # a stream's: its usage, read at its end
        self.tokens: Tokens | None = None  # what the engine said it cost
        self.on_usage = on_usage  # told once, at the end
        self.pool = pool
        self.metrics = metrics
        self.endpoint = endpoint
        self.model = model
        self.target = target
        self.body = body
        self.headers = headers
        self.started = started
        self.handle: PendingAsk | None = None
        self.slot: Slot | None = None
        self.response: Response | None = None
        self.label = UNKNOWN_MODEL
        self.status = 499  # nginx's "client closed request" until we know better
        self.closed = False
        self.method = method
        self.adapter = adapter  # LoRA: checked against the engine before sending
        self.remember = remember  # (alias, first bytes) of a stored response
        self.progress = progress  # the comments a stream waits in
        self.retry = True  # a held claim that proved stale may be asked for again, once
        self.framing = framing  # a stream's: "sse", or "ndjson" (Ollama's API)
        self.watch = watch  # its place on the board of waiting requests (waits.py)
        metrics.in_flight.inc()

    # ------------------------------------------------------------ steps

    async def admit(self) -> PendingAsk:
        """Ask for a slot; the handle to wait on for it (``ControlError`` and
        ``Unreachable`` become the route's error)."""
        try:
            self.handle = await self.acquire()
        except (ControlError, Unreachable) as exc:
            raise self.failed(control_error(self.model, exc)) from None
        if self.watch is not None and not self.handle.answered:
            self.watch.arrived()  # it waits: on the board
        return self.handle

    def got_slot(self, slot: Slot, waited: float) -> None:
        self.slot = slot
        self.label = slot.alias
        self.metrics.waited(slot.alias, waited)
        if self.watch is not None:
            self.watch.sent()

    def failed(self, err: ApiError) -> ApiError:
        """Record an error's status (and a bounded model label) and return it."""
        self.status = err.status
        if err.code in _NAME_KNOWN and self.label == UNKNOWN_MODEL:
            # The daemon knew the name (load failed, timeout...): a config alias,
            # safe as a label. Anything else keeps the placeholder.
            self.label = self.model
        return err

    async def open_upstream(self) -> Response:
        """Send the original body to the engine; return once its headers are in."""
        assert self.slot is not None
        if self.adapter is not None:
            await self._check_adapter(self.slot, self.adapter)
        try:
            self.response = await self.pool.request(
                self.slot.url, self.target, self.headers, self.body, method=self.method
            )
        except ConnectFailed as exc:
            if not self.retry:
                raise self.upstream_error(exc) from None
            self._give_up_slot()
            raise StaleClaim from None
        except UpstreamError as exc:
            raise self.upstream_error(exc) from None
        return self.response

    def _give_up_slot(self) -> None:
        """The engine of the claim refused the connection: nothing was sent, so the
        request may go elsewhere. The claim is given up; the flow asks for a slot anew
        (``admit``: the daemon reloads the engine, or says why not); once per request."""
        assert self.slot is not None
        self.retry = False
        self.broker.stale(self.slot)
        self.slot.leave()
        self.slot = None

    async def _check_adapter(self, slot: Slot, adapter: str) -> None:
        """``alias:adapter`` reaches the engine only if it lists the adapter (its /v1/models)."""
        from ktd.frontend.catalog import engine_adapters

        listed = await engine_adapters(self.pool, slot.url, slot.alias)
        if listed is not None and adapter not in listed:
            raise self.failed(
                errors.make("unknown_adapter", model=self.model, adapter=adapter, listed=listed)
            )

    def upstream_error(self, exc: UpstreamError) -> ApiError:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, UpstreamTimeout):
            err = errors.make("upstream_timeout", model=self.label, detail=detail)
        else:
            err = errors.make("upstream_failed", model=self.label, detail=detail)
        self.metrics.upstream_errors.labels(self.label, exc.kind).inc()
        log.warning("upstream %s for %s: %s", exc.kind, self.label, detail)
        return self.failed(err)

    def first_byte(self) -> None:
        self.metrics.first_byte(self.label, trio.current_time() - self.started)
        if self.watch is not None:
            self.watch.first_token()

    def client_deaf(self) -> None:
        """The client stopped reading (``frontend.send_timeout``; the transport said so and
        closed the connection): closing the exchange frees its slot and aborts the
        engine's request."""
        self.status = 499  # nginx's "client closed request": counted apart from the 200s

    # ------------------------------------------------------------ end

    async def aclose(self) -> None:
        """Close upstream, leave the slot, count the request. Idempotent, cancel-proof."""
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.handle is not None:
            self.handle.abandon()
        if self.response is not None:
            self.response.close()
        if self.slot is not None:
            self.slot.leave()
        self.metrics.in_flight.dec()
        self.metrics.request_done(self.endpoint, self.label, self.status)
        if self.watch is not None:
            self.watch.closed(self.label)
        if self.on_usage is not None and self.label != UNKNOWN_MODEL:
            # A stream that began (the engine's 200), ended or cut short: what it carried.
            opened = self.response is not None and self.response.status == 200
            if self.tally is not None and opened and self.slot is not None:
                self.tokens = self.tally.tokens()
            self.on_usage(self)


class StaleClaim(Exception):
    """Raised by ``open_upstream`` once it gave up a stale claim's slot: ask anew."""


def loading_comment(
    alias: str, elapsed: float, expected: float | None = None, *, verb: str = "loading"
) -> bytes:
    """An SSE comment: OpenAI clients skip it, proxies see traffic, humans see progress.

    The name comes from the client: control characters are dropped so that it
    cannot end the comment line and forge an event. ``expected``: the load ETA;
    ``verb``: ``waking`` for an asleep engine (seconds, not a load's minutes).
    """
    safe = "".join(ch for ch in alias if ch.isprintable())
    eta = f" of ~{int(expected)}s expected" if expected else ""
    return f": {verb} {safe} {int(elapsed)}s{eta}\n\n".encode()


async def relay(ex: Exchange, send: Send, *, interval: float = 2.0) -> None:
    """Body of a streaming response (status already sent: 200 or the engine's own).

    If the exchange has no upstream response yet, the request is still waiting
    for its engine: send ``: loading`` comments every ``interval`` seconds until
    its slot comes, then open the upstream. Any failure after the status line
    went out becomes one ``data: {"error": ...}`` event and ``data: [DONE]``
    (an ``{"error": ...}`` line in an NDJSON stream).
    Ends the HTTP response (``more_body: False``) unless cancelled, or unless the client
    stopped reading (``ClientDeaf``, ``frontend.send_timeout``): its slot must not be
    held for ever; the connection is closed, and the exchange's end frees the slot and
    closes the upstream (SGLang aborts the request).
    """

    async def give(data: bytes, more: bool) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})

    try:
        await _relay(ex, give, interval)
    except ClientDeaf:
        ex.client_deaf()


async def _relay(ex: Exchange, give: Give, interval: float) -> None:
    last = b"\n\n"
    tail = b""
    try:
        if ex.response is None:
            await give(await _comment(ex, first=True), True)
            while True:
                slot = await _next_slot(ex, give, interval)
                ex.got_slot(slot, trio.current_time() - ex.started)
                try:
                    opened = await ex.open_upstream()
                    break
                except StaleClaim:
                    await ex.admit()  # wait (with comments) for the new slot
            if opened.status != 200:
                data = await opened.read()
                raise ex.failed(errors.from_upstream_body(opened.status, data))
        response = ex.response
        assert response is not None
        ex.status = response.status
        tally = ex.tally
        pass_on = tally.pass_on if tally is not None else None
        # The first chunk outside the hot loop: TTFB without per-chunk cost.
        data = await response.receive()
        if data and ex.remember is not None and ex.slot is not None:
            ex.remember(ex.slot.alias, data)
        if data:
            ex.first_byte()
            if pass_on is not None:
                data = pass_on(data)
            last = data or last
            if response.done:
                await give(data + _rest(tally), False)
                return
            if data:
                await give(data, True)
        receive = response.receive
        while not response.done:
            data = await receive()
            if data:
                if pass_on is not None:
                    data = pass_on(data)
                last = data or last
                if not response.done:
                    if data:
                        await give(data, True)
                    continue
                await give(data + _rest(tally), False)
                return
        tail = _rest(tally)
    except UpstreamError as exc:
        tail = _error_tail(ex, ex.upstream_error(exc), last)
    except ApiError as err:
        ex.failed(err)
        tail = _error_tail(ex, err, b"\n\n")
    await give(tail, False)


def _rest(tally: StreamTally | None) -> bytes:
    """What a stripping tally still holds when the stream ends (an unterminated event)."""
    return tally.rest() if tally is not None else b""


async def _next_slot(ex: Exchange, give: Give, interval: float) -> Slot:
    """Wait for the exchange's slot, a ``: loading`` comment every ``interval`` seconds,
    and a progress event as soon as its progress changes (its ticket is poked)."""
    assert ex.handle is not None
    due = trio.current_time() + interval
    while True:
        slot = None
        with trio.CancelScope() as poked:
            if ex.watch is not None:
                ex.watch.poke_scope = poked
            try:
                slot = await ex.handle.wait(max(0.0, due - trio.current_time()))
            except (ControlError, Unreachable) as exc:
                raise ex.failed(control_error(ex.model, exc)) from None
        if ex.watch is not None:
            ex.watch.poke_scope = None
        if slot is not None:
            return slot
        if poked.cancelled_caught and ex.handle.answered:
            continue  # the slot came as we were poked: take it
        if trio.current_time() >= due:
            due = trio.current_time() + interval
            await give(await _comment(ex), True)
        elif ex.watch is not None and (event := ex.watch.event()):
            await give(event, True)


def _error_tail(ex: Exchange, err: ApiError, last: bytes) -> bytes:
    """The error event that ends a stream already at 200, in the stream's own framing.

    A chunk cut mid-event would glue our event onto its half line: a separator first.
    NDJSON (Ollama's API) ends with an ``{"error": ...}`` line, as Ollama's own do.
    """
    if ex.framing == "ndjson":
        return (b"" if last.endswith(b"\n") else b"\n") + err.ndjson()
    return (b"" if last.endswith(b"\n\n") else b"\n\n") + err.sse() + SSE_DONE


async def _comment(ex: Exchange, *, first: bool = False) -> bytes:
    """The ``: loading`` comment, and the progress event (``waits.py``) after it."""
    elapsed = trio.current_time() - ex.started
    if ex.progress is not None:
        comment = await ex.progress(elapsed)
    else:
        comment = loading_comment(ex.model, elapsed)
    if ex.watch is None:
        return comment
    return comment + ex.watch.event(force=True, first=first)


def waiting_comment(what: str, elapsed: float) -> bytes:
    """``: waiting for <alias> Ns``: the engine waits for another to go idle (or a slot)."""
    safe = "".join(ch for ch in what if ch.isprintable())
    return f": waiting for {safe} {int(elapsed)}s\n\n".encode()
