"""The dashboard's HTTP surface: ``/ui`` and ``/ui/...``, answered on raw ASGI messages.

The router (router.py) hands over the ``owner="ui"`` rows of routes.py's table; the
dashboard answers them, its streams included, without Quart (whose per-chunk timeouts
would cut a live stream, and whose answers do not close connections as asked).

Paths (the page computes them from its own address, so they are relative to it):

=====================  ======  =============================================
``ui``                 GET     the page (no data in it)
``ui/favicon.svg``     GET     the icon
``ui/api/session``     GET     whether a key is needed, shown, and buttons on
``ui/api/login``       POST    ``{"key"}`` -> the session cookie
``ui/api/logout``      POST    the cookie removed
``ui/api/view``        GET     the view once (cards, machine)           key
``ui/api/series``      GET     the hour of traffic                      key
``ui/api/events``      GET     the live stream (``?logs=ALIAS``)        key
``ui/api/logs``        GET     ``?alias=&lines=``: the log tail         key
``ui/api/plan``        GET     ``?alias=``: dry-run and memory estimate key
``ui/api/action``      POST    ``{"action", "alias"}``: load/evict/     key, ui_control
                               sleep/wake/reload
``ui/api/config``      GET     the editor: models.json (secrets         key, ui_control
                               marked), fields, history
``ui/api/config/plan`` POST    ``{"base", change}``: its plan            key, ui_control
``ui/api/config/apply`` POST   ``{"base", change}``: applied            key, ui_control
=====================  ======  =============================================

A change is ``{"alias", "entry"}`` (the form), ``{"models_text"}`` (the raw view) or
``{"rollback": N}`` (the history); ``base`` is the version the editor was given.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from ktd import foreign
from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError
from ktd.core import usage
from ktd.core.loglines import Seam
from ktd.frontend import errors, inbound
from ktd.frontend.body import too_deep
from ktd.frontend.errors import ApiError
from ktd.frontend.inbound import Receive, Scope, Send
from ktd.frontend.proxy import control_error
from ktd.frontend.router import UI_HEADERS, send_shaped
from ktd.frontend.routes import Match
from ktd.frontend.transport import ClientDeaf
from ktd.frontend.ui import configedit, wire
from ktd.frontend.ui.access import CONTROL_HEADER, Access, cookie_value, set_cookie
from ktd.frontend.ui.hub import SUBSCRIBE_WAIT, Hub, Item, LogLines, Viewer
from ktd.frontend.ui.page import Page
from ktd.frontend.waits import Waits

log = logging.getLogger("ktd.frontend.ui")

MAX_BODY = 64 << 10
TAIL_LINES = 500
# An evict or a sleep that drains longer (or a wake that takes longer) answers "under
# way"; the daemon goes on.
ACTION_WAIT = 5.0
USAGE_DAYS = 30  # the dashboard's usage panel: the last month, today included
ACTIONS = ("load", "evict", "sleep", "wake", "reload")
#: The editor's plan asks each changed model's SGLang about its flags (a probe: 120 s at most).
CONFIG_WAIT = 130.0
# What the daemon answers a sleep or a wake it will not do: no sleep configured or
# supported, or not running / not asleep. The message says why (409, not a 503).
_REFUSED = frozenset({p.ErrorCode.NO_SLEEP, p.ErrorCode.NOT_LOADED})

Handler = Callable[["UiRequest"], Awaitable[None]]


class UiRequest:
    """One request to the dashboard: the ASGI triple and what access decided."""

    __slots__ = ("allowed", "query", "receive", "scope", "send", "who")

    def __init__(self, scope: Scope, receive: Receive, send: Send, access: Access) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        self.who = access.who(self.header(b"authorization"), self.headers(b"cookie"))
        self.allowed = not access.required or self.who is not None

    def headers(self, name: bytes) -> list[bytes]:
        return inbound.headers(self.scope, name)

    def header(self, name: bytes) -> bytes | None:
        return inbound.header(self.scope, name)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    @property
    def secure(self) -> bool:
        return self.scope.get("scheme") == "https"

    async def body(self) -> bytes:
        try:
            return await inbound.read_body(self.receive, MAX_BODY)
        except inbound.Disconnected:
            raise errors.make("disconnected") from None

    async def json(self) -> dict[str, Any]:
        try:
            obj = foreign.json_any(await self.body())
        except foreign.TooDeep as exc:
            raise too_deep(exc) from None
        except msgspec.DecodeError:
            raise errors.make(
                "bad_request", message="expected a JSON object", code="invalid_json"
            ) from None
        if not isinstance(obj, dict):
            raise errors.make("bad_request", message="expected a JSON object", code="invalid_json")
        return obj

    async def respond(
        self,
        status: int,
        body: bytes,
        ctype: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        out = [(b"content-type", ctype), *UI_HEADERS, *(headers or [])]
        await inbound.respond(self.send, status, body, out)

    async def json_reply(self, obj: Any, status: int = 200, **kw: Any) -> None:
        await self.respond(status, wire.encode(obj), **kw)

    async def error(self, err: ApiError) -> None:
        await send_shaped(self.send, "ui", err)


class Dashboard:
    """The ``owner="ui"`` rows of routes.py: ``/ui`` and below (router.py hands them over)."""

    def __init__(
        self, hub: Hub, access: Access, page: Page, *, heartbeat: float, waits: Waits | None = None
    ):
        self.hub = hub
        self.waits = waits  # the requests waiting at this frontend (issue 46)
        self.access = access
        self.page = page
        self.heartbeat = heartbeat
        # routes.py's endpoints -> their handlers
        self.handlers: dict[str, Handler] = {
            "index": self.index,
            "favicon": self.favicon,
            "session": self.session,
            "login": self.login,
            "logout": self.logout,
            "view": self.view,
            "series": self.series,
            "events": self.events,
            "logs": self.logs,
            "plan": self.plan,
            "usage": self.usage,
            "waiting": self.waiting,
            "action": self.action,
            "config": self.config,
            "config_plan": self.config_plan,
            "config_apply": self.config_apply,
        }

    async def answer(self, found: Match, scope: Scope, receive: Receive, send: Send) -> None:
        req = UiRequest(scope, receive, send, self.access)
        try:
            if not found.route.open and not req.allowed:
                raise errors.make("key_needed")
            await self.handlers[found.route.endpoint](req)
        except ApiError as err:
            await req.error(err)
        except Exception:
            log.exception("dashboard: unexpected error on %s %s", scope["method"], scope["path"])
            try:  # a 500 if nothing was sent yet; Hypercorn closes the connection otherwise
                await req.error(errors.make("internal", message="internal frontend error"))
            except Exception:
                pass

    # ------------------------------------------------------------ page, session

    async def index(self, req: UiRequest) -> None:
        headers = [
            (b"content-security-policy", self.page.csp.encode("ascii")),
            (b"x-frame-options", b"DENY"),
        ]
        await req.respond(200, self.page.html, b"text/html; charset=utf-8", headers)

    async def favicon(self, req: UiRequest) -> None:
        await req.respond(200, self.page.favicon, b"image/svg+xml")

    def _session(self, allowed: bool, admin: bool) -> dict[str, Any]:
        return {
            "auth": self.access.required,
            "ok": allowed,
            "control": self.access.control and allowed and admin,
            "heartbeat": self.heartbeat,
        }

    async def session(self, req: UiRequest) -> None:
        await req.json_reply(self._session(req.allowed, req.who is not None and req.who.admin))

    async def login(self, req: UiRequest) -> None:
        key = (await req.json()).get("key")
        if not self.access.required:
            await req.json_reply(self._session(True, False))
            return
        who = self.access.who(f"Bearer {key}".encode(), []) if isinstance(key, str) else None
        if not isinstance(key, str) or not key or who is None:
            raise errors.make("wrong_api_key") if key else errors.make("missing_api_key")
        cookie = set_cookie(cookie_value(key), secure=req.secure).encode("latin-1")
        await req.json_reply(self._session(True, who.admin), headers=[(b"set-cookie", cookie)])

    async def logout(self, req: UiRequest) -> None:
        cookie = set_cookie("", secure=req.secure, max_age=0).encode("latin-1")
        session = self._session(not self.access.required, False)
        await req.json_reply(session, headers=[(b"set-cookie", cookie)])

    # ------------------------------------------------------------ data

    async def view(self, req: UiRequest) -> None:
        await req.respond(200, await self.hub.current_view())

    async def series(self, req: UiRequest) -> None:
        await req.respond(200, self.hub.series_json())

    async def logs(self, req: UiRequest) -> None:
        alias = _alias(req.arg("alias"))
        try:
            lines = max(0, min(int(req.arg("lines") or TAIL_LINES), 10_000))
        except ValueError:
            raise errors.make(
                "bad_request", message="lines: expected a number", param="lines"
            ) from None
        try:
            tail = await self.hub.logs(alias, lines)
        except (ControlError, Unreachable) as exc:
            raise control_error(alias, exc) from None
        await req.json_reply({"alias": alias, "lines": tail})

    async def plan(self, req: UiRequest) -> None:
        alias = _alias(req.arg("alias"))
        try:
            plan = await self.hub.plan(alias)
        except (ControlError, Unreachable) as exc:
            raise control_error(alias, exc) from None
        await req.json_reply({"alias": alias, "plan": plan})

    async def usage(self, req: UiRequest) -> None:
        """The usage ledger's last ``USAGE_DAYS`` days (UTC): every key's for an admin key
        (or a frontend without keys), else only the viewer's own key's."""
        since = usage.days_before(usage.day_of(time.time()), USAGE_DAYS - 1)
        who = req.who
        key = who.name if self.access.required and who is not None and not who.admin else None
        try:
            reply = await self.hub.broker.request(p.Usage(since=since, key=key))
        except (ControlError, Unreachable) as exc:
            raise control_error("", exc) from None
        rows = reply.rows if isinstance(reply, p.UsageReply) else []
        await req.json_reply({"since": since, "days": USAGE_DAYS, "rows": rows})

    async def waiting(self, req: UiRequest) -> None:
        """The requests waiting here (``ktd.frontend.waits``): every key's for an admin
        key (or a frontend without keys), else only the viewer's own key's."""
        who = req.who
        key = who.name if self.access.required and who is not None and not who.admin else None
        await req.json_reply({"data": self.waits.listing(key=key) if self.waits else []})

    async def action(self, req: UiRequest) -> None:
        if not self.access.may_act(req.who, req.header(CONTROL_HEADER)):
            why = "off (frontend.ui_control)" if not self.access.control else "not allowed"
            raise errors.make("forbidden", message=f"The dashboard's actions are {why}.")
        body = await req.json()
        action = body.get("action")
        if action not in ACTIONS:
            raise errors.make(
                "bad_request", message=f"action: one of {', '.join(ACTIONS)}", param="action"
            )
        msg: p.Request
        if action == "reload":
            msg, alias = p.Reload(), ""
        else:
            alias = _alias(body.get("alias") if isinstance(body.get("alias"), str) else None)
            msg = _request(action, alias)
        broker = self.hub.broker
        log.info("dashboard: %s %r", action, alias or "(config)")
        reply: p.Reply | None = None
        try:
            await broker.ping()  # a daemon that is away is a 503 now, not "under way"
            with trio.move_on_after(ACTION_WAIT):
                reply = await broker.request(msg, timeout=math.inf)
        except ControlError as exc:
            if action in ("sleep", "wake") and exc.code in _REFUSED:
                # Not a daemon fault: this engine cannot (or need not) do it now; say why.
                raise errors.make("conflict", message=exc.message, code=exc.code) from None
            raise control_error(alias, exc) from None
        except Unreachable as exc:
            raise control_error(alias, exc) from None
        if reply is None:
            message, status = f"{action} {alias}: under way", 202
        else:
            message, status = _done(action, alias, reply), 200
        await req.json_reply({"ok": True, "message": message}, status=status)

    # ------------------------------------------------------------ the config editor

    def _may_edit(self, req: UiRequest) -> None:
        if not self.access.may_act(req.who, req.header(CONTROL_HEADER)):
            why = "off (frontend.ui_control)" if not self.access.control else "not allowed"
            raise errors.make("forbidden", message=f"The dashboard's editor is {why}.")

    async def _ask(self, msg: p.Request, timeout: float = CONFIG_WAIT) -> p.Reply:
        try:
            return await self.hub.broker.request(msg, timeout=timeout)
        except ControlError as exc:
            raise _config_error(exc) from None
        except Unreachable as exc:
            raise control_error("", exc) from None

    async def config(self, req: UiRequest) -> None:
        self._may_edit(req)
        got = await self._ask(p.ConfigGet(delegated=True))
        history = await self._ask(p.ConfigHistory())
        assert isinstance(got, p.ConfigReply) and isinstance(history, p.ConfigHistoryReply)
        await req.json_reply(configedit.editor_view(got, history))

    async def _change(
        self, req: UiRequest
    ) -> tuple[dict[str, Any], p.ConfigReply, str, str | None]:
        """The page's change against the files now: (body, files, base, new models text;
        None for a rollback). A base that is no longer the files' version is stale."""
        self._may_edit(req)
        body = await req.json()
        base = body.get("base")
        if not isinstance(base, str) or not _VERSION.match(base):
            raise errors.make("bad_request", message="base: the version the editor was given")
        got = await self._ask(p.ConfigGet(delegated=True))
        assert isinstance(got, p.ConfigReply)
        if got.version != base:
            raise _stale(base, got.version)
        if "rollback" in body:
            return body, got, base, None
        try:
            text = configedit.text_for(body, got.models_text)
        except configedit.ChangeError as exc:
            raise errors.make("bad_request", message=str(exc)) from None
        return body, got, base, text

    async def config_plan(self, req: UiRequest) -> None:
        body, _, base, text = await self._change(req)
        if text is None:
            msg: p.Request = p.ConfigRollback(
                seq=_seq(body), base=base, dry_run=True, delegated=True
            )
        else:
            msg = p.ConfigPlan(models_text=text, base=base, delegated=True)
        reply = await self._ask(msg)
        assert isinstance(reply, p.ConfigPlanReply)
        plan = configedit.shown_plan(reply.plan)
        await req.json_reply({"plan": plan})

    async def config_apply(self, req: UiRequest) -> None:
        body, _, base, text = await self._change(req)
        who = req.who
        author = f"key {who.name} (dashboard)" if who is not None else "dashboard"
        if text is None:
            msg: p.Request = p.ConfigRollback(
                seq=_seq(body), base=base, author=author, delegated=True
            )
        else:
            msg = p.ConfigApply(models_text=text, base=base, author=author, delegated=True)
        log.info("dashboard: config %s by %s", "rollback" if text is None else "apply", author)
        reply = await self._ask(msg)
        assert isinstance(reply, p.ConfigApplyReply)
        await req.json_reply(
            {
                "ok": True,
                "version": reply.version,
                "seq": reply.seq,
                "message": f"applied version {reply.version}: {reply.summary}",
                "plan": configedit.shown_plan(reply.plan),
            }
        )

    # ------------------------------------------------------------ the live stream

    async def events(self, req: UiRequest) -> None:
        hub = self.hub
        if hub.closing.is_set():
            raise errors.make("frontend_stopping")
        logs = req.arg("logs")
        viewer = hub.join(_alias(logs) if logs else None)
        try:
            headers = [
                (b"content-type", b"text/event-stream"),
                (b"x-accel-buffering", b"no"),
                *UI_HEADERS,
            ]
            await req.send({"type": "http.response.start", "status": 200, "headers": headers})
            gone = False
            async with trio.open_nursery() as nursery:

                async def until_disconnect() -> None:
                    nonlocal gone
                    while (await req.receive())["type"] != "http.disconnect":
                        pass
                    gone = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_disconnect)
                try:
                    await self._stream(req, viewer)
                except ClientDeaf:
                    # Its reader stopped for ``frontend.send_timeout`` (the transport
                    # said so in the log and closed the connection): let the page go.
                    gone = True
                nursery.cancel_scope.cancel()
            if not gone:  # the frontend is stopping, or the page fell behind: end cleanly
                await req.send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            hub.leave(viewer)

    async def _stream(self, req: UiRequest, viewer: Viewer) -> None:
        hub = self.hub

        async def out(data: bytes) -> None:
            await req.send({"type": "http.response.body", "body": data, "more_body": True})

        admin = req.who is not None and req.who.admin
        hello = wire.event("hello", wire.encode(self._session(True, admin)))
        await out(wire.retry(1000) + hello)
        view = wire.event("view", await hub.current_view())
        await out(view + wire.event("series", hub.series_json()))
        if viewer.logs is not None:
            await out(await self._tail(viewer))
        while True:
            items: list[Item] = []
            with trio.move_on_after(self.heartbeat):
                try:
                    items.append(await viewer.recv.receive())
                except trio.EndOfChannel:
                    return  # dropped: the frontend is stopping, or this page fell behind
            if not items:
                await out(wire.event("ping", b'{"now":%.3f}' % time.time()))
                continue
            while len(items) < 64:
                try:
                    items.append(viewer.recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await out(b"".join(_frame(viewer, item) for item in items))

    async def _tail(self, viewer: Viewer) -> bytes:
        """The log tail, then what was logged while it was fetched (without repeats)."""
        alias = viewer.logs
        assert alias is not None
        with trio.move_on_after(SUBSCRIBE_WAIT):
            await self.hub.subscribed.wait()
        try:
            tail, upto = await self.hub.logs(alias, TAIL_LINES)
        except (ControlError, Unreachable) as exc:
            tail, upto = [f"[ktd: no log for {alias}: {exc}]"], 0
        viewer.seam = Seam(tail, upto)  # what arrives later may still be in the tail
        early: list[tuple[int, list[str]]] = []
        held: list[bytes] = []
        while True:
            try:
                item = viewer.recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if isinstance(item, LogLines):
                early.append((item.upto, item.lines))
            else:
                held.append(item)
        fresh = viewer.seam.opening(early)
        data = wire.event("logtail", wire.encode({"alias": alias, "lines": tail}))
        if fresh:
            data += _log_frame(alias, fresh)
        return data + b"".join(held)


_VERSION = re.compile(r"^[0-9a-f]{1,64}$")


def _seq(body: dict[str, Any]) -> int:
    seq = body.get("rollback")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise errors.make("bad_request", message="rollback: a version number of the history")
    return seq


def _stale(base: str, now: str) -> ApiError:
    return errors.make(
        "conflict",
        message=f"The configuration changed since this editor read it (version {base}; it is "
        f"{now} now). Nothing was applied: reload the editor and make the change on what is "
        "there.",
        code=p.ErrorCode.STALE_CONFIG,
    )


def _config_error(exc: ControlError) -> ApiError:
    """The daemon's refusal of a change, for the page: 409 with its code and message
    (a stale base, a config error naming the file and field, busy, a write that failed);
    403 for what needs ktd's owner."""
    if exc.code in _CONFIG_REFUSALS:
        return errors.make("conflict", message=exc.message, code=exc.code)
    if exc.code == p.ErrorCode.FORBIDDEN:  # needs ktd's owner (docs/security.md)
        return errors.make("forbidden", message=exc.message)
    return control_error("", exc)


_CONFIG_REFUSALS = frozenset(
    {
        p.ErrorCode.STALE_CONFIG,
        p.ErrorCode.CONFIG_ERROR,
        p.ErrorCode.BUSY,
        p.ErrorCode.WRITE_FAILED,
        p.ErrorCode.BAD_REQUEST,
    }
)


def _frame(viewer: Viewer, item: Item) -> bytes:
    if isinstance(item, LogLines):
        lines = viewer.fresh(item)
        return _log_frame(viewer.logs, lines) if lines else b""
    return item


def _log_frame(alias: str | None, lines: list[str]) -> bytes:
    return wire.event("log", wire.encode({"alias": alias, "lines": lines}))


def _alias(value: str | None) -> str:
    if not value or len(value) > p.MAX_MODEL_NAME:
        raise errors.make("bad_request", message="alias: expected a model name", param="alias")
    return value


def _request(action: str, alias: str) -> p.Request:
    """The control request a card's button sends (ktctl's: load --no-wait, evict, sleep, wake)."""
    if action == "load":
        return p.Load(alias=alias, wait=False)
    if action == "sleep":
        return p.Sleep(alias=alias)
    if action == "wake":
        return p.Wake(alias=alias)
    return p.Evict(alias=alias)


def _done(action: str, alias: str, reply: p.Reply) -> str:
    if isinstance(reply, p.EvictReply):
        if not reply.evicted:
            return f"{alias} was not running"
        return f"evicted {', '.join(reply.evicted)}"
    if isinstance(reply, p.LoadReply):
        return f"{alias}: {reply.engine.state}"
    if isinstance(reply, p.Ok):
        return reply.message or f"{action} done"
    return f"{action} {alias}: done"
