"""Hypercorn's trio request intake, patched where every request paid for nothing.

Measured (bench/trace_request.py, bench/RESULTS.md issue 22): from the moment
Hypercorn's trio server read a request's bytes to the moment the app could act
on its body, a request went through five trips through trio's scheduler that
did no work, and its end through a lock and a new task. Each trip is a whole
pass of the run loop (an ``epoll_wait`` and every other runnable task) on the
request's critical path. Three patches, all behaviour-preserving:

* **The keep-alive timer is one task per connection, moved, not restarted.**
  Hypercorn stops the connection's idle timer when a request arrives and starts
  a new timer task when its response ends (``TrioSingleTask``: a ``trio.Lock``
  and a ``nursery.start`` each time). ``IdleTimer`` keeps one task that waits
  for the worker's shutdown under a cancel scope whose deadline is the idle
  deadline: arming and disarming set the deadline (synchronous, no task), and
  the task closes the connection exactly when Hypercorn's would: idle for
  ``keep_alive_timeout``, or idle while the server shuts down.
* **The app's queue is filled without a checkpoint.** Hypercorn hands each
  request message (the body, its end, the disconnect) to the app through a
  memory channel's ``send``, which yields to the scheduler even when the
  buffer has room. ``send_nowait`` does the same without the trip; a full
  buffer still waits (the app's backpressure is unchanged).
* **The app can take what is queued without a checkpoint, and hear the
  disconnect without a task.** Every HTTP scope carries
  ``scope["extensions"]["ktd.intake"]``, an ``Intake``: ``receive_nowait()``
  returns a queued message (``trio.WouldBlock`` if there is none), and
  ``on_disconnect`` is called when Hypercorn queues ``http.disconnect`` (from
  inside Hypercorn's task: it must be synchronous). flow.py uses both; an app
  that does not still gets every message through ``receive`` as before.

And one that is not about speed: **a connection's protocol error ends that connection,
not the frontend** (Hypercorn's connection task lets anything but ``OSError`` escape
to the listener's nursery; ``tests/frontend/test_h2.py`` has the case that did).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

EXTENSION = "ktd.intake"

log = logging.getLogger("ktd.frontend")


class Intake:
    """What the patched intake offers one request's app (``scope["extensions"]``)."""

    __slots__ = ("on_disconnect", "receive_nowait")

    def __init__(self, receive_nowait: Callable[[], Any]) -> None:
        self.receive_nowait = receive_nowait
        self.on_disconnect: Callable[[], object] | None = None


def _put_for(
    channel: trio.MemorySendChannel[Any], intake: Intake | None
) -> Callable[[Any], Awaitable[None]]:
    async def put(message: Any) -> None:
        if intake is not None and message["type"] == "http.disconnect":
            callback = intake.on_disconnect
            if callback is not None:
                callback()
        try:
            channel.send_nowait(message)
        except trio.WouldBlock:
            await channel.send(message)

    return put


class IdleTimer:
    """Drop-in for ``TrioSingleTask`` as ``TCPServer.idle_task`` (see the module docstring)."""

    __slots__ = ("_closed", "_deadline", "_scope", "_server", "_started", "_task_scope")

    def __init__(self, server: Any) -> None:
        self._server = server
        self._deadline = math.inf  # inf: a request is in progress (disarmed)
        self._scope: trio.CancelScope | None = None
        self._task_scope: trio.CancelScope | None = None
        self._started = False
        self._closed = False

    async def restart(self, task_group: Any, action: object) -> None:
        """Arm: the connection closes after ``keep_alive_timeout`` unless a request comes."""
        if self._closed:
            return
        if self._server.context.terminated.is_set():
            self._deadline = trio.current_time()  # shutting down: an idle connection closes now
        else:
            self._deadline = trio.current_time() + self._server.config.keep_alive_timeout
        if self._scope is not None:
            self._scope.deadline = self._deadline
        if not self._started:
            self._started = True
            task_group._nursery.start_soon(self._run)

    async def stop(self) -> None:
        """Disarm: a request is in progress."""
        self.disarm()

    def disarm(self) -> None:
        self._deadline = math.inf
        if self._scope is not None:
            self._scope.deadline = math.inf

    def close(self) -> None:
        """The connection is done reading: end the timer's task (its server closes)."""
        self._closed = True
        if self._task_scope is not None:
            self._task_scope.cancel()

    async def _run(self) -> None:
        terminated = self._server.context.terminated
        with trio.CancelScope() as self._task_scope:
            if self._closed:
                return
            while True:
                with trio.CancelScope(deadline=self._deadline) as self._scope:
                    if terminated.is_set():
                        await trio.sleep_forever()  # only arming (deadline: now) ends it
                    else:
                        await terminated.wait()
                self._scope = None
                deadline = self._deadline
                if deadline != math.inf and (
                    terminated.is_set() or trio.current_time() >= deadline
                ):
                    break
        if self._closed:
            return
        with trio.CancelScope(shield=True):
            await self._server._initiate_server_close()


def install() -> None:
    """Patch Hypercorn's trio worker (idempotent): its connections (``_patch_server``)
    and the start of the app for each request (``_patch_spawn``)."""
    from hypercorn.trio import tcp_server

    server_cls: Any = tcp_server.TCPServer
    if getattr(server_cls, "_ktd_intake", False):
        return
    _patch_server(server_cls)
    _patch_spawn()
    server_cls._ktd_intake = True


def _patch_server(server_cls: Any) -> None:
    """The connection's side: its idle timer is an ``IdleTimer``, fed by Hypercorn's
    ``Updated`` events, and a protocol's exception ends its own connection only."""
    from hypercorn.events import Closed, Updated

    init = server_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.idle_task = IdleTimer(self)

    read_data = server_cls._read_data

    async def _read_data(self: Any) -> None:
        try:
            await read_data(self)
        except Exception as exc:
            # Hypercorn's connection task catches OSError only: anything else a
            # protocol raises on one connection's bytes (0.18's HTTP/2 ``KeyError`` for
            # a DATA frame on a stream it has answered and closed, which
            # sglang-router's gRPC probe sends) left the task group for the
            # listener's nursery and the frontend exited. It ends this connection.
            log.warning("closing a connection after %s: %s", type(exc).__name__, exc)
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self.protocol.handle(Closed())
        finally:
            self.idle_task.close()

    protocol_send = server_cls.protocol_send

    async def send(self: Any, event: Any) -> None:
        if type(event) is Updated:
            if event.idle:
                await self.idle_task.restart(self._task_group, self._idle_timeout)
            else:
                self.idle_task.disarm()
            return
        await protocol_send(self, event)

    server_cls.__init__ = __init__
    server_cls._read_data = _read_data
    server_cls.protocol_send = send


def _patch_spawn() -> None:
    """The request's side: each HTTP request's app gets its ``Intake`` in the scope's
    extensions, reading the body straight off the app's channel."""
    from hypercorn.trio import task_group

    async def spawn_app(
        self: Any, app: Any, config: Any, scope: Any, send: Any
    ) -> Callable[[Any], Awaitable[None]]:
        channel, receiver = trio.open_memory_channel[Any](config.max_app_queue_size)
        intake = None
        if scope["type"] == "http":
            intake = Intake(receiver.receive_nowait)
            scope.setdefault("extensions", {})[EXTENSION] = intake
        self._nursery.start_soon(
            task_group._handle,
            app,
            config,
            scope,
            receiver.receive,
            send,
            trio.to_thread.run_sync,
            trio.from_thread.run,
        )
        return _put_for(channel, intake)

    task_group.TaskGroup.spawn_app = spawn_app  # type: ignore[method-assign]
