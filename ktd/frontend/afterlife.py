"""Keep Quart-Trio from cancelling Hypercorn's end-of-response bookkeeping.

What goes wrong without this (Quart-Trio 0.12 on Hypercorn 0.18, trio worker;
any Quart-Trio app, one route is enough): the answers Quart serves ignore
``Connection: close`` and HTTP/1.0 (the socket stays open after the response),
their keep-alive connections never time out (``frontend.idle_timeout``), and one
such idle connection holds a SIGTERM for the whole graceful timeout.

Why: Hypercorn finishes a response from *inside* the app's last ``send``: the
final body message runs ``H11Protocol._maybe_recycle``, which first queues an
``http.disconnect`` for the app (``HTTPStream.handle(StreamClosed)``) and then
either closes the socket (``Closed`` -> ``TCPServer._close``: the client asked to
close, or spoke HTTP/1.0) or arms the keep-alive idle timer (``Updated(idle=True)``
-> ``idle_task.restart``). Quart-Trio runs every request as two tasks in one
nursery; the one that reads ``receive()`` takes that disconnect and cancels the
nursery (``TrioASGIHTTPConnection.handle_messages``), and the other task is the
one still inside ``send``: its next checkpoint (``send_eof`` before the close, or
the timer's restart) raises ``Cancelled``. The socket is never closed, the timer
never armed; only the client closing, or the graceful timeout at shutdown, ends
the connection. A bare ASGI app that does not cancel itself on that disconnect
closes at once (ktd's own proxied routes: flow.py's ``_Watch``).

So Quart is handed a ``receive`` that, once the response is complete, keeps the
disconnect to itself (it waits until Quart's own request task, done sending,
cancels it). A disconnect *before* the response ends (a client that went away)
still reaches Quart and cancels the request as it should.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class QuietAfterResponse:
    """``receive``/``send`` for one request to Quart (see the module docstring)."""

    __slots__ = ("_receive", "_send", "done")

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.done = False

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.done = True  # before the send: the disconnect is queued from inside it
        await self._send(message)

    async def receive(self) -> Any:
        message = await self._receive()
        if message["type"] == "http.disconnect" and self.done:
            await trio.sleep_forever()  # Quart cancels this task itself once its send returns
        return message
