"""The request flow of every proxied route, straight on ASGI messages.

Every ``owner="proxy"`` row of routes.py (chat, completions, embeddings, Responses,
Anthropic Messages, SGLang's native and scoring routes, audio, Ollama's chat and
generate) is answered here; router.py hands each request over after one look-up.
Why not Quart: its per-request machinery (request and app contexts, the response
object, its body iterator with a timeout per chunk, signals) cost more than the
proxying itself, and a streamed answer paid for Quart on every chunk.

HTTP/1.1 discipline: the request body is always read to its end before the
answer, on every path, including the ones that fail early (401, 404, 405):
a keep-alive client that sends its body after the headers would otherwise
wait forever for the answer to its next request. When the body cannot be read
to its end (too large, too slow), the answer says ``Connection: close``.

Request flow:

1. The path was normalised by the router (``//v1/x`` is ``/v1/x``); the query
   string is never forwarded (``?api_key=`` must not reach the engine).
2. API key, then the body (size-limited), then the routing fields only
   (``model``/``stream`` of JSON, the ``model`` form field of multipart audio;
   routes.py says what routes a request without one).
3. A slot on the model's claim (``broker.py``): at once when this frontend
   holds the claim and has room under ``max_concurrent``, with no message to the
   daemon; otherwise in line (``max_queue``), while one ``Claim`` asks the daemon,
   which loads on demand and queues behind busy engines.
4. Non-streaming: wait for the slot, send the original bytes upstream, answer
   with the engine's status and body.
   Streaming: wait for the slot for at most ``stream_grace`` seconds. Decided in
   time -> the client gets the real status. Not decided (a load, or a queue) ->
   answer 200 at once and keep the client company with ``: loading`` /
   ``: waking`` / ``: waiting for`` comments; from then on failures are in-band
   error events. An asleep engine is a model like one not loaded: the claim asks
   the daemon, which wakes it.

Client disconnects: once the body is read, ``http.disconnect`` cancels the
request (as quart-trio does), and the ``finally`` closes the upstream
connection and leaves the slot. Under ktd's patched Hypercorn intake
(intake.py) Hypercorn calls the request's ``_Watch`` itself when it queues the
disconnect, and queued messages are taken without a trip through the
scheduler; under any other ASGI server a task per request waits on ``receive()``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from ktd import multipart
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.admission import ANYONE, KeyTerms
from ktd.frontend import catalog, errors, keepalive, reserve
from ktd.frontend.body import check_declared_length, check_model, parse_head, unreadable
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import (
    JSON_HEADER,
    Disconnected,
    Receive,
    Scope,
    Send,
    drain,
    header,
    read_body_in_time,
    respond,
    send_error,
)
from ktd.frontend.intake import EXTENSION, Intake
from ktd.frontend.metrics import NO_MODEL
from ktd.frontend.ollama import ollama_alias
from ktd.frontend.proxy import (
    SSE_CONTENT_TYPE,
    STREAM_HEADERS,
    Exchange,
    StaleClaim,
    backward_headers,
    control_error,
    forward_headers,
    loading_comment,
    relay,
    stream_headers,
    waiting_comment,
)
from ktd.frontend.routes import (
    MODEL_HEADER,
    Match,
    Route,
    forwarded_query,
    response_id_in,
    split_lora,
)
from ktd.frontend.slot import PendingAsk
from ktd.frontend.tally import Api, StreamTally, ask_for_usage, body_tokens
from ktd.frontend.upstream import UpstreamError

if TYPE_CHECKING:
    from ktd.frontend.state import State

log = logging.getLogger("ktd.frontend")

# States in which a request waits for a wake, not a load (the claim wakes it).
WAKES = frozenset({S.ASLEEP, S.WAKING, S.SLEEPING})

#: OpenAI's streaming routes whose usage chunk is asked for when the client did not
#: ask (and then taken out of what the client sees).
_USAGE_ASKED = frozenset({"chat", "completions"})


class _Watch:
    """Cancels the request when the client goes away, but not after the answer ended.

    Hypercorn queues an ``http.disconnect`` for every request when its response
    is complete, from inside our last ``send``: cancelling then would interrupt
    Hypercorn's own connection bookkeeping (keep-alive timer) halfway.

    Under ktd's patched intake (intake.py) Hypercorn calls ``gone`` itself when
    it queues the disconnect: no task per request. Elsewhere (another ASGI
    server) a task waits on ``receive()`` for it (``run``).
    """

    __slots__ = ("finished", "left", "scope", "send")

    def __init__(self, send: Send, scope: trio.CancelScope) -> None:
        self.send = send
        self.scope = scope
        self.finished = False
        self.left = False  # the client went away before the answer ended

    async def tracked_send(self, message: Any) -> None:
        if not message.get("more_body", False) and message["type"] == "http.response.body":
            self.finished = True
        await self.send(message)

    def gone(self) -> None:
        if not self.finished:
            self.left = True
            self.scope.cancel()

    def hook(self, intake: Intake) -> None:
        """Hear the disconnect from Hypercorn; one queued before we listened counts too
        (after the body's end nothing but a disconnect can be queued)."""
        intake.on_disconnect = self.gone
        try:
            message = intake.receive_nowait()
        except trio.WouldBlock:
            return
        if message["type"] == "http.disconnect":
            self.gone()

    async def run(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone()
                return


def _quick(receive: Receive, intake: Intake | None) -> Receive:
    """``receive`` that takes an already queued message without a trip through the
    scheduler (intake.py); the usual ``receive`` when nothing is queued."""
    if intake is None:
        return receive
    nowait = intake.receive_nowait

    async def quick() -> Any:
        try:
            return nowait()
        except trio.WouldBlock:
            return await receive()

    return quick


class Flow:
    """The proxied routes' handler (routes.py's ``owner="proxy"`` rows, router.py)."""

    def __init__(self, state: State) -> None:
        self.state = state

    async def proxy(self, found: Match, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        route = found.route
        endpoint = route.endpoint
        ollama = route.api == "ollama"
        started = trio.current_time()
        body_read = False
        intake: Intake | None = scope.get("extensions", {}).get(EXTENSION)
        receive = _quick(receive, intake)
        try:
            try:
                policy = state.keys.of(scope)
            except ApiError as err:
                # Swallow a small body so the client's next request on this
                # connection is answered; a big one is not worth reading for a 401.
                body_read = await drain(receive)
                raise err from None
            body = await self._read_body(scope, receive)
            body_read = True
            model, stream, ctype = self._routing_fields(found, scope, body)
            if model is None:
                model = await self._fallback_model(found, scope)
            if ollama:
                model = ollama_alias(model)
            if policy is not None and not policy.allows(split_lora(model)[0]):
                raise errors.make("model_forbidden", key=policy.name, model=model)
            kind, keep = "generate", None
            if ollama:
                try:
                    kind, keep = keepalive.read(body, route.path)
                except ValueError as exc:
                    raise errors.make("bad_request", message=str(exc)) from None
        except ApiError as err:
            state.metrics.request_done(endpoint, NO_MODEL, err.status)
            await send_error(send, err, close=not body_read, ollama=ollama)
            return
        except Disconnected:
            state.metrics.request_done(endpoint, NO_MODEL, 499)
            return

        key = ANYONE if policy is None else policy.terms
        base = split_lora(model)[0]
        if kind != "generate":
            await self._load_or_unload(base, route.path, kind, keep, key, send)
            return
        try:
            held = state.broker.reserve(key, reserve.of(key, endpoint, body))
        except ApiError as err:  # its tokens_per_day: spent, or held by its requests
            state.metrics.request_done(endpoint, NO_MODEL, err.status)
            await send_error(send, err, ollama=ollama)
            return
        ex = self._exchange_for(found, scope, model, body, stream, ctype, key, started)
        try:
            await self._watched(ex, base, stream, scope, receive, send, intake)
        finally:
            ex.close()  # counts what it used (``_used``), then its reservation goes back
            state.broker.release(held)
        if keep is not None:
            await self._keep_alive(base, keep)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, within ``max_body_bytes`` and the body's time bounds; one
        whose declared length is already too long is refused before a byte is read."""
        options = self.state.options
        declared = header(scope, b"content-length")
        if declared is not None:
            try:
                check_declared_length(int(declared), options.frontend.max_body_bytes)
            except ValueError:
                pass  # Hypercorn (h11) refuses a malformed length before we get here
        return await read_body_in_time(receive, *options.body_bounds)

    def _exchange_for(
        self,
        found: Match,
        scope: Scope,
        model: str,
        body: bytes,
        stream: bool,
        ctype: bytes | None,
        key: KeyTerms,
        started: float,
    ) -> Exchange:
        """The request as one ``Exchange``, complete: where it goes, how it asks for a
        slot on its key's terms, and how its usage is read (a stream's usage chunk asked
        for when OpenAI's client did not ask)."""
        state, route = self.state, found.route
        endpoint = route.endpoint
        ollama = route.api == "ollama"
        base, adapter = split_lora(model)
        api: Api = "ollama" if ollama else "anthropic" if endpoint == "messages" else "openai"
        tally = None
        if stream:
            asked = ask_for_usage(body) if endpoint in _USAGE_ASKED else None
            body = asked or body
            tally = StreamTally(api, strip=asked is not None)
        return Exchange(
            broker=state.broker,
            pool=state.upstream,
            metrics=state.metrics,
            endpoint=endpoint,
            model=model,
            target=_target(scope, route),
            body=body,
            headers=forward_headers(scope["headers"], ctype),
            started=started,
            acquire=functools.partial(self._acquire, base, key),
            key=key,
            api=api,
            tally=tally,
            on_usage=self._used,
            method=scope["method"].encode("ascii"),
            adapter=adapter,
            framing="ndjson" if ollama else "sse",
            remember=self._remember if route.remember else None,
            progress=self._progress_for(base),
            watch=state.waits.ticket(
                base, key.name, endpoint, scope["headers"], stream=stream and not ollama
            ),
        )

    async def _acquire(self, alias: str, key: KeyTerms) -> PendingAsk:
        """Ask for a slot on ``alias`` on the frontend's terms (autoload, load timeout)
        and the key's."""
        front = self.state.options.frontend
        return await self.state.broker.start_acquire(
            alias, autoload=front.autoload, load_timeout=front.load_timeout, key=key
        )

    async def _watched(
        self,
        ex: Exchange,
        base: str,
        stream: bool,
        scope: Scope,
        receive: Receive,
        send: Send,
        intake: Intake | None,
    ) -> None:
        """Answer ``ex``, cancelled if the client goes away before the answer ended
        (then its status is 499, and its usage says it was cut)."""
        if intake is not None:
            try:
                with trio.CancelScope() as cancel:
                    watch = _Watch(send, cancel)
                    watch.hook(intake)
                    await self._answer(ex, base, stream, watch.tracked_send, scope)
            finally:
                intake.on_disconnect = None
        else:
            async with trio.open_nursery() as nursery:
                watch = _Watch(send, nursery.cancel_scope)
                nursery.start_soon(watch.run, receive)
                await self._answer(ex, base, stream, watch.tracked_send, scope)
                nursery.cancel_scope.cancel()
        if watch.left:
            ex.status = 499  # nginx's "client closed request", as for a deaf client

    async def _keep_alive(self, alias: str, seconds: float) -> None:
        """The client's keep-alive to the daemon, after its request (a failure to say it
        fails nothing the client asked for: logged)."""
        forever = math.isinf(seconds)
        msg = p.KeepAlive(model=alias, seconds=0.0 if forever else seconds, forever=forever)
        try:
            await self.state.broker.request(msg, timeout=10)
        except (ControlError, Unreachable) as exc:
            log.warning("keep_alive for %s not applied: %s", alias, exc)

    async def _load_or_unload(
        self, alias: str, route: str, kind: str, keep: float | None, key: KeyTerms, send: Send
    ) -> None:
        """Ollama's empty requests, answered as Ollama does: a load waits for the engine
        (and applies its keep-alive), an unload (``keep_alive: 0``) sends it off when idle."""
        try:
            if kind == "load":
                handle = await self._acquire(alias, key)
                try:
                    slot = await handle.wait()
                except ControlError as exc:  # a catalog name not pulled (notpulled.py)
                    await self.state.not_pulled.settle(alias, exc)
                    slot = await (await self._acquire(alias, key)).wait()
                if slot is not None:
                    slot.leave()
        except (ControlError, Unreachable) as exc:
            await send_error(send, control_error(alias, exc), ollama=True)
            return
        except ApiError as err:
            await send_error(send, err, ollama=True)
            return
        if keep is not None:
            await self._keep_alive(alias, keep)
        data = keepalive.answer(alias, route, "unload" if kind == "unload" else "load")
        await respond(send, 200, data, [JSON_HEADER])

    async def _answer(
        self, ex: Exchange, base: str, stream: bool, send: Send, scope: Scope
    ) -> None:
        """The exchange, and any error it ends in as the answer (in the route's shape)."""
        ollama = ex.framing == "ndjson"
        try:
            await self._exchange(ex, base, stream, send)
        except ApiError as err:
            ex.failed(err)
            await send_error(send, err, ollama=ollama)
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            internal = errors.make("internal", message="internal frontend error")
            ex.failed(internal)
            await _try_send_error(send, internal, ollama=ollama)

    # ------------------------------------------------------------ routing

    def _routing_fields(
        self, found: Match, scope: Scope, body: bytes
    ) -> tuple[str | None, bool, bytes | None]:
        """(model or None, stream, content-type to forward) from the body."""
        route = found.route
        if route.body == "json":
            head = parse_head(
                body, require_model=route.model == "required", ollama=route.api == "ollama"
            )
            return head.model, head.stream, b"application/json"
        ctype = header(scope, b"content-type")
        if route.body == "multipart":
            text = (ctype or b"").decode("latin-1")
            try:
                model = multipart.text_field(body, text, "model")
                stream = multipart.text_field(body, text, "stream")
            except multipart.MultipartError as exc:
                raise unreadable(
                    f"Expected a multipart/form-data body: {exc}", "invalid_body"
                ) from None
            if not model:
                raise errors.make(
                    "bad_request", message="you must provide a model parameter", param="model"
                )
            return check_model(model), (stream or "").strip().lower() == "true", ctype
        return None, False, ctype

    async def _fallback_model(self, found: Match, scope: Scope) -> str:
        """No model in the body: remembered response id, ``X-Ktd-Model``, the only ready engine."""
        if found.param is not None:
            alias = self.state.responses.get(found.param)
            if alias is not None:
                return alias
        named = header(scope, MODEL_HEADER)
        if named is not None and named.strip():
            return check_model(named.strip().decode("utf-8", "replace"))
        # While the daemon is away, the engines this frontend holds claims on still count.
        ready = [e.alias for e in await catalog.ready_engines(self.state.broker)]
        ready = ready or self.state.broker.routed()
        if len(ready) == 1:
            return ready[0]
        raise errors.make("model_required", path=scope["path"], why=errors.ready_engines(ready))

    def _remember(self, alias: str, data: bytes) -> None:
        response_id = response_id_in(data)
        if response_id is not None:
            self.state.responses.add(response_id, alias)

    def _progress_for(self, alias: str) -> Callable[[float], Awaitable[bytes]]:
        broker = self.state.broker

        async def progress(elapsed: float) -> bytes:
            info = await catalog.engine_status(broker, alias)
            if info is not None:
                if info.state in (S.STARTING, S.WAKING) and info.waiting_for:  # a swap
                    return waiting_comment(", ".join(info.waiting_for), elapsed)
                if info.state == S.READY:
                    return waiting_comment(alias, elapsed)  # queued for a slot
                if info.state in WAKES:  # asleep: the claim wakes it (the daemon does)
                    return loading_comment(alias, elapsed, verb="waking")
                if info.load_started:  # the load's own age, and what loads took before
                    ran = max(elapsed, time.time() - info.load_started)
                    return loading_comment(alias, ran, info.load_eta)
            return loading_comment(alias, elapsed)

        return progress

    def _used(self, ex: Exchange) -> None:
        """A request for a known model ended: what it cost, for the ledger, the key's day
        and the per-key metrics. An error is any error status but the client's own
        going away (499), which is counted as cut: it is charged what it received."""
        error = ex.status >= 400 and ex.status != 499
        cut = ex.status == 499
        self.state.broker.used(ex.key.name, ex.label, ex.tokens, error=error, cut=cut)
        self.state.metrics.key_used(ex.key.name, ex.label, ex.tokens, error=error)

    async def _exchange(self, ex: Exchange, base: str, stream: bool, send: Send) -> None:
        state = self.state
        options = state.options
        # An NDJSON stream (Ollama's) has no comment to wait in: as Ollama does, the
        # answer waits for the engine, and its status is the real one.
        grace = options.stream_grace if stream and ex.framing == "sse" else math.inf
        handle = await ex.admit()
        settled = False  # a catalog name's pull (notpulled.py) asks again, once
        while True:
            try:
                slot = await handle.wait(grace)
            except (ControlError, Unreachable) as exc:
                if settled:
                    raise ex.failed(control_error(ex.model, exc)) from None
                try:
                    await state.not_pulled.settle(ex.model, exc)
                except (ControlError, Unreachable) as why:
                    raise ex.failed(control_error(ex.model, why)) from None
                settled = True
                handle = await ex.admit()
                continue
            if slot is None:
                # Still loading or queued: answer 200 now, and wait inside the body.
                headers = [SSE_CONTENT_TYPE, *STREAM_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await relay(ex, send, interval=options.loading_interval)
                return
            ex.got_slot(slot, trio.current_time() - ex.started)
            try:
                upstream = await ex.open_upstream()
                break
            except StaleClaim:
                handle = await ex.admit()  # its engine was gone: a new slot, as the first
        if stream and upstream.status == 200:
            headers = stream_headers(upstream.headers)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await relay(ex, send, interval=options.loading_interval)
            return
        try:
            data = await upstream.read()
        except UpstreamError as exc:
            raise ex.upstream_error(exc) from None
        ex.status = upstream.status
        if upstream.status == 200:
            ex.tokens = body_tokens(ex.api, data)
        ex.first_byte()
        if ex.remember is not None and upstream.status == 200:
            ex.remember(slot.alias, data)
        headers = backward_headers(upstream.headers)
        if upstream.status >= 400:
            shaped = errors.in_route_shape(ex.api, upstream.status, data)
            if shaped is not None:
                data = shaped
                headers = [(k, v) for k, v in headers if k != b"content-type"]
                headers.append(JSON_HEADER)
        await respond(send, upstream.status, data, headers)


async def _try_send_error(send: Send, err: ApiError, *, ollama: bool = False) -> None:
    """A 500 if nothing was sent yet; Hypercorn ignores it (or closes) otherwise."""
    try:
        await send_error(send, err, ollama=ollama)
    except Exception:
        pass


def _target(scope: Scope, route: Route) -> bytes:
    """The path, and of the query only the route's own parameters (``/v1/loads``'s).

    The rest of the query string stays here: no other SGLang route reads one, and a
    client's ``?api_key=`` must never reach the engine or its logs.
    """
    path: bytes = scope["path"].encode("utf-8", "surrogateescape")
    query = forwarded_query(route, bytes(scope.get("query_string", b"")))
    return path + b"?" + query if query else path
