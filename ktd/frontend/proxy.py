"""Upstream HTTP: one pooled httpx client and the per-request exchange.

The hot path is the chunk loop in ``relay``: receive bytes from the engine, hand
them to the server, nothing else (no parsing, no re-encoding, no per-chunk
bookkeeping; the first chunk is pulled out of the loop so time-to-first-byte
costs nothing per chunk). Everything per-request (headers, lease, metrics) is
done once, before or after the loop.

Cleanup is owned by ``Exchange.aclose``, which is idempotent and runs from
whichever comes first: the stream's ``finally``, the route's ``finally``, or the
per-request guard in app.py (the case where the server never started the body
at all). It closes the upstream response (an unfinished one closes its TCP
connection, which is how SGLang learns to abort the generation) and then
releases the lease.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable

import httpx
import trio

from ktd.aclient import ControlError, Unreachable
from ktd.frontend import errors
from ktd.frontend.errors import SSE_DONE, ApiError
from ktd.frontend.leases import AcquireHandle, Lease, LeaseBroker
from ktd.frontend.metrics import UNKNOWN_MODEL, Metrics

log = logging.getLogger("ktd.frontend")

# Request headers never forwarded to the engine: hop-by-hop (RFC 9110 7.6.1),
# ones httpx sets itself, and the client's credentials (the engine does not
# need the frontend's key, and must not see it). accept-encoding is dropped
# and pinned to identity so bytes pass through without content-coding surprises.
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
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
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

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def make_http_client(
    *,
    read_timeout: float,
    connect_timeout: float = 5.0,
    max_connections: int = 4096,
    max_keepalive: int = 1024,
) -> httpx.AsyncClient:
    """The one pooled client (anyio picks the trio backend at run time).

    read: between two chunks, so it must cover a long prefill; no total
    timeout (streams last as long as generation does); pool: how long a request
    may queue for a free connection.
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(
            connect=connect_timeout, read=read_timeout or None, write=60.0, pool=60.0
        ),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_keepalive,
            keepalive_expiry=30.0,
        ),
        headers={"accept-encoding": "identity"},
        follow_redirects=False,
        trust_env=False,  # an http_proxy in the environment must not catch 127.0.0.1
    )


def pool_counts(client: httpx.AsyncClient) -> tuple[int, int]:
    """(active, idle) upstream connections; reads httpcore internals, best effort."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    conns = getattr(pool, "connections", None) or []
    active = idle = 0
    for conn in conns:
        try:
            if conn.is_closed():
                continue
            if conn.is_idle():
                idle += 1
            else:
                active += 1
        except Exception:  # pragma: no cover - httpcore internals changed
            continue
    return active, idle


def forward_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop, host, length and credentials.

    Content-Type is always ``application/json``: the body was just checked to
    be a JSON object, and SGLang refuses anything else with a 400 that
    ``curl -d`` users (form-urlencoded by default) would not expect.
    """
    connection_named: set[bytes] = set()
    kept: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
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


def backward_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.multi_items() if k.lower() not in _DROP_RESPONSE]


def control_error(model: str, exc: Exception) -> ApiError:
    """Map what the broker raises to the client-facing error."""
    if isinstance(exc, ControlError):
        return errors.from_control(model, exc.code, exc.message, exc.detail)
    return errors.daemon_unreachable(str(exc))


class Exchange:
    """One proxied request: its lease, its upstream response, its metrics."""

    def __init__(
        self,
        *,
        broker: LeaseBroker,
        http: httpx.AsyncClient,
        metrics: Metrics,
        endpoint: str,
        model: str,
        target: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        started: float,
    ) -> None:
        self.broker = broker
        self.http = http
        self.metrics = metrics
        self.endpoint = endpoint
        self.model = model
        self.target = target
        self.body = body
        self.headers = headers
        self.started = started
        self.handle: AcquireHandle | None = None
        self.lease: Lease | None = None
        self.response: httpx.Response | None = None
        self.label = UNKNOWN_MODEL
        self.status = 499  # nginx's "client closed request" until we know better
        self.closed = False
        metrics.in_flight.inc()

    # ------------------------------------------------------------ steps

    def got_lease(self, lease: Lease, waited: float) -> None:
        self.lease = lease
        self.label = lease.alias
        self.metrics.load_wait.labels(lease.alias).observe(waited)

    def failed(self, err: ApiError) -> ApiError:
        """Record an error's status (and a bounded model label) and return it."""
        self.status = err.status
        if err.code in _NAME_KNOWN and self.label == UNKNOWN_MODEL:
            # The daemon knew the name (load failed, timeout...): a config alias,
            # safe as a label. Anything else keeps the placeholder.
            self.label = self.model
        return err

    async def open_upstream(self) -> httpx.Response:
        """Send the original body to the engine; return once its headers are in."""
        assert self.lease is not None
        request = self.http.build_request(
            "POST", self.lease.url + self.target, content=self.body, headers=self.headers
        )
        try:
            self.response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self.upstream_error(exc) from None
        return self.response

    def upstream_error(self, exc: httpx.HTTPError) -> ApiError:
        if isinstance(exc, httpx.TimeoutException):
            kind = "timeout"
            err = errors.upstream_timeout(self.label, f"{type(exc).__name__}: {exc}")
        else:
            kind = "connect" if isinstance(exc, httpx.ConnectError) else "broken"
            detail = str(exc) or type(exc).__name__
            err = errors.upstream_failed(self.label, detail)
        self.metrics.upstream_errors.labels(self.label, kind).inc()
        log.warning("upstream %s for %s: %s: %s", kind, self.label, type(exc).__name__, exc)
        return self.failed(err)

    def first_byte(self) -> None:
        self.metrics.ttfb.labels(self.label).observe(trio.current_time() - self.started)

    # ------------------------------------------------------------ end

    async def aclose(self) -> None:
        """Close upstream, release the lease, count the request. Idempotent, cancel-proof."""
        if self.closed:
            return
        self.closed = True
        if self.handle is not None:
            self.handle.abandon()
        response = self.response
        if response is not None and not response.is_closed:
            # Shielded and bounded: we are often here because of a cancellation
            # (client went away), and an unshielded aclose would be cancelled
            # before httpcore marks the connection closed -> leaked pool slot
            # (httpx #3782, httpcore #658).
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 2.0
                try:
                    await response.aclose()
                except Exception as exc:  # closing a broken connection may complain
                    log.debug("closing upstream response: %r", exc)
        if self.lease is not None:
            self.broker.release(self.lease.lease)
        self.metrics.in_flight.dec()
        self.metrics.requests.labels(self.endpoint, self.label, str(self.status)).inc()


def loading_comment(alias: str, elapsed: float) -> bytes:
    """An SSE comment: OpenAI clients skip it, proxies see traffic, humans see progress.

    The name comes from the client: control characters are dropped so that it
    cannot end the comment line and forge an event.
    """
    safe = "".join(ch for ch in alias if ch.isprintable())
    return f": loading {safe} {int(elapsed)}s\n\n".encode()


async def relay(ex: Exchange, *, interval: float = 2.0) -> AsyncIterator[bytes]:
    """Body of a streaming response (status already 200 or the engine's own).

    If the exchange has no upstream response yet, the request is still waiting
    for its engine: send ``: loading`` comments every ``interval`` seconds until
    the lease comes, then open the upstream. Any failure after the status line
    went out becomes one ``data: {"error": ...}`` event and ``data: [DONE]``.
    """
    chunk = b"\n\n"
    try:
        try:
            if ex.response is None:
                assert ex.handle is not None
                yield loading_comment(ex.model, trio.current_time() - ex.started)
                while True:
                    try:
                        lease = await ex.handle.wait(interval)
                    except (ControlError, Unreachable) as exc:
                        raise ex.failed(control_error(ex.model, exc)) from None
                    if lease is not None:
                        break
                    yield loading_comment(ex.model, trio.current_time() - ex.started)
                ex.got_lease(lease, trio.current_time() - ex.started)
                opened = await ex.open_upstream()
                if opened.status_code != 200:
                    body = await opened.aread()
                    raise ex.failed(errors.from_upstream_body(opened.status_code, body))
            response = ex.response
            assert response is not None
            ex.status = response.status_code
            chunks = response.aiter_raw()
            try:
                # The first chunk outside the hot loop: TTFB without per-chunk cost.
                async for chunk in chunks:
                    ex.first_byte()
                    yield chunk
                    break
                async for chunk in chunks:
                    yield chunk
            finally:
                await _aclose_shielded(chunks)
        except httpx.HTTPError as exc:
            err = ex.upstream_error(exc)
            # A chunk cut mid-event would glue our event onto its half line.
            sep = b"" if chunk.endswith(b"\n\n") else b"\n\n"
            yield sep + err.sse() + SSE_DONE
        except ApiError as err:
            ex.failed(err)
            yield err.sse() + SSE_DONE
    finally:
        await ex.aclose()


async def _aclose_shielded(gen: AsyncIterator[bytes]) -> None:
    aclose = getattr(gen, "aclose", None)
    if aclose is None:
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + 2.0
        try:
            await aclose()
        except Exception as exc:
            log.debug("closing upstream iterator: %r", exc)
