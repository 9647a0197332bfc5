"""Which browsers' requests the frontend answers: Origin, Host, JSON bodies, WebSockets.

Why: the default setup (no keys, bound to 127.0.0.1, as ``ktd up --demo``) trusts
whoever reaches the port, and a web page in the operator's browser reaches it too. A
cross-site page can send a "simple" request (no preflight: a ``text/plain`` body) that
loads a model of hundreds of GB; a DNS-rebinding page (``evil.example`` resolving to
127.0.0.1) can read the dashboard, its argv and the engines' logs. Ollama, whose API
ktd speaks, refuses both for the same reason; ktd does as its middleware does:

* **Origin**: a request that carries ``Origin`` must come from the frontend's own origin
  (the ``Host`` it was sent to) or one of ``frontend.allowed_origins`` (``*``: any).
  Browsers send ``Origin`` with every cross-site request and with every POST; clients
  that are not browsers (the official SDKs, curl) send none and are not affected.
* **Host**: bound to a loopback address, the ``Host`` must be a loopback address,
  ``localhost`` (or a ``.localhost`` name), this machine's name, or one of
  ``frontend.allowed_hosts``. Bound elsewhere any ``Host`` passes: rebinding buys an
  attacker nothing there that he could not reach directly.
* **JSON bodies**: a POST to a JSON route must say ``application/json`` (or a
  ``+json`` type): the types a page may send without a preflight (``text/plain``,
  forms) are refused with 415, so a cross-site page cannot post a body ktd would read.
* **WebSockets**: ktd serves none: an upgrade is refused at the handshake (403),
  quietly.

Each refusal is a typed error in the route's own shape (routes.py's ``api_of``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ktd.frontend import errors
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import Receive, Scope, Send, header, may_have_body
from ktd.frontend.router import send_shaped
from ktd.frontend.routes import TABLE, api_of

#: POST paths whose bodies are not JSON (multipart audio).
_NOT_JSON = frozenset(r.path for r in TABLE if r.body == "multipart")


def is_loopback_bind(bind: str) -> bool:
    """Whether ``bind`` (``HOST:PORT``) listens on loopback only."""
    if bind.startswith("unix:"):
        return False  # no browser reaches a Unix socket
    host = bind.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """``Host`` without its port (``[::1]:8000`` -> ``::1``), lower-case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class OriginPolicy:
    """The checks for one frontend (pure but for reading the machine's name once)."""

    def __init__(
        self,
        bind: str,
        *,
        allowed_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        hostname: str | None = None,
    ) -> None:
        self.check_host = is_loopback_bind(bind)
        self.any_origin = "*" in allowed_origins
        self.origins = {o.rstrip("/").lower() for o in allowed_origins if o != "*"}
        self.any_host = "*" in allowed_hosts
        self.hosts = {h.lower() for h in allowed_hosts if h != "*"}
        name = (hostname if hostname is not None else socket.gethostname()).lower()
        self.hosts.add(name)

    def host_ok(self, host: str | None) -> bool:
        if not self.check_host or self.any_host or not host:
            return True  # HTTP/1.0 without Host: no browser sends that
        name = _host_name(host)
        if name in ("localhost", *self.hosts) or name.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None or self.any_origin:
            return True
        given = origin.strip().rstrip("/").lower()
        if given in self.origins:
            return True
        parts = urlsplit(given)
        # The frontend's own origin: the page was served by the host this request went to.
        own = host is not None and parts.netloc == host.strip().lower()
        return own and parts.scheme in ("http", "https")

    def refusal(self, scope: Scope) -> ApiError | None:
        """Why this request is refused, or None."""
        host = _text(header(scope, b"host"))
        if not self.host_ok(host):
            return errors.make("bad_host", host=_printable(host or ""))
        origin = _text(header(scope, b"origin"))
        if not self.origin_ok(origin, host):
            return errors.make("bad_origin", origin=_printable(origin or ""))
        if (
            scope.get("method") == "POST"
            and scope.get("path") not in _NOT_JSON
            and may_have_body(scope)
            and not is_json(_text(header(scope, b"content-type")))
        ):
            return errors.make("not_json")
        return None


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _printable(text: str) -> str:
    return "".join(ch for ch in text[:200] if ch.isprintable())


class Guard:
    """The ASGI middleware in front of every route (the proxy, Ollama's, the dashboard,
    Quart's): refuses what ``OriginPolicy`` refuses, and every WebSocket."""

    def __init__(self, app: Any, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: a 403
            return
        if kind == "http":
            err = self.policy.refusal(scope)
            if err is not None:
                await send_shaped(send, api_of(str(scope.get("path", ""))), err, close=True)
                return
        await self.app(scope, receive, send)
