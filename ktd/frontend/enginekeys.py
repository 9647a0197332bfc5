"""The engines' API keys by URL, as the daemon tells them: what the engine hop sends.

Why: every engine runs with a key of its own (``ktd.daemon.engine.key``) and answers
401 without it, so that no other local user reaches it past the frontend's keys and
admission. A claim brings its engine's key (``ClaimReply.api_key``); the frontend's
other engine calls (``/server_info``, ``/api/show``, the adapters' ``/v1/models``)
find the engine in a status, which never carries keys, and ask the daemon for them
(``EngineKeys``) the first time they meet a URL, or when the engine answers 401 (a
new run on the same port has a new key). Asking is shared by whoever waits at that
moment and happens at most once a second while a URL stays unknown. A claim that says
its engine has no key (an SGLang that cannot take one) is believed, as its keys are: that
URL is not asked about again until it answers 401, so requests on a held claim never
wait for the daemon (down, they would each have waited out the question's timeout).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio

from ktd.control.aclient import Unreachable
from ktd.control.errors import ControlError

__all__ = ["KeyCache"]

Ask = Callable[[], Awaitable[dict[str, str]]]


def _norm(url: str) -> str:
    return url.rstrip("/")


class KeyCache:
    def __init__(self, ask: Ask | None = None, *, min_interval: float = 1.0) -> None:
        self._ask = ask
        self._headers: dict[str, bytes] = {}
        self._keyless: set[str] = set()  # what claims said runs without a key
        self._min_interval = min_interval
        self._asked_at = -float("inf")
        self._asking: trio.Event | None = None

    def learn(self, url: str, key: str | None) -> None:
        """What a claim said of its engine's key (None: the engine has none)."""
        url = _norm(url)
        if key:
            self._headers[url] = f"Bearer {key}".encode()
            self._keyless.discard(url)
        else:
            self._headers.pop(url, None)
            self._keyless.add(url)

    def header(self, url: str) -> bytes | None:
        """The ``Authorization`` value for the engine at ``url``, if it has a key we know."""
        return self._headers.get(_norm(url))

    async def refresh(self, *, force: bool = False) -> None:
        """Ask the daemon for every engine's key (at most once a second unless ``force``:
        a 401 means the key changed). A daemon that does not answer changes nothing."""
        if self._ask is None:
            return
        if self._asking is not None:
            await self._asking.wait()
            return
        if not force and time.monotonic() - self._asked_at < self._min_interval:
            return
        self._asking = done = trio.Event()
        self._asked_at = time.monotonic()
        try:
            keys = await self._ask()
        except (Unreachable, ControlError):  # keep what we know
            return
        else:
            self._headers = {_norm(url): f"Bearer {key}".encode() for url, key in keys.items()}
            self._keyless -= self._headers.keys()
        finally:
            self._asking = None
            done.set()

    async def header_for(self, url: str) -> bytes | None:
        """``header``, asking the daemon first when ``url`` is unknown (not when a claim
        said its engine has no key)."""
        found = self.header(url)
        if found is None and _norm(url) not in self._keyless:
            await self.refresh()
            found = self.header(url)
        return found
