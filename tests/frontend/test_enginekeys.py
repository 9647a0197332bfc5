"""The engine hop carries each engine's own key (issue 32): ``KeyCache`` + ``UpstreamPool``.

A raw-socket server plays a keyed engine (401 ``{"error": "Unauthorized"}`` without
``Authorization: Bearer <key>``, as SGLang's middleware answers); the daemon's answer
to ``KeyCache`` is a function the test controls.
"""

from __future__ import annotations

import trio

from ktd.control.aclient import Unreachable
from ktd.frontend.enginekeys import KeyCache
from ktd.frontend.upstream import UpstreamPool
from tests.frontend.test_upstream import Server, read_request, serve

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
DENIED = (
    b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
    b'content-length: 25\r\n\r\n{"error":"Unauthorized"}\n'
)


class KeyedEngine:
    """Answers 200 to ``Bearer <key>`` only; records every Authorization it was sent."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen: list[bytes | None] = []

    async def handle(self, stream: trio.SocketStream, n: int) -> None:
        while True:
            req = await read_request(stream)
            if not req:
                return
            auth = None
            for line in req.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"authorization":
                    auth = value.strip()
            self.seen.append(auth)
            await stream.send_all(OK if auth == f"Bearer {self.key}".encode() else DENIED)


async def start(nursery: trio.Nursery, key: str) -> tuple[KeyedEngine, Server]:
    engine = KeyedEngine(key)
    return engine, await serve(nursery, engine.handle)


async def get(pool: UpstreamPool, url: str) -> int:
    resp = await pool.request(url, b"/v1/models", [], b"", method=b"GET")
    try:
        await resp.read()
    finally:
        resp.close()
    return resp.status


async def test_a_claims_key_is_sent_and_the_daemon_is_not_asked(nursery: trio.Nursery) -> None:
    engine, server = await start(nursery, "k1")
    asked = 0

    async def ask() -> dict[str, str]:
        nonlocal asked
        asked += 1
        return {}

    keys = KeyCache(ask)
    keys.learn(server.url + "/", "k1")  # as a ClaimReply says it (a trailing / or not)
    pool = UpstreamPool(read_timeout=5, keys=keys)
    assert await get(pool, server.url) == 200
    assert engine.seen == [b"Bearer k1"] and asked == 0


async def test_an_unknown_url_asks_the_daemon_once_and_a_new_key_after_a_401(
    nursery: trio.Nursery,
) -> None:
    """A status-found engine: its key asked of the daemon; a new run on the same port (a
    new key): the 401 makes the pool ask again and send once more with the new key."""
    engine, server = await start(nursery, "k1")
    daemon = {server.url: "k1"}
    asked = 0

    async def ask() -> dict[str, str]:
        nonlocal asked
        asked += 1
        return dict(daemon)

    pool = UpstreamPool(read_timeout=5, keys=KeyCache(ask))
    assert await get(pool, server.url) == 200
    assert await get(pool, server.url) == 200
    assert asked == 1
    engine.key = daemon[server.url] = "k2"
    assert await get(pool, server.url) == 200
    assert engine.seen == [b"Bearer k1", b"Bearer k1", b"Bearer k1", b"Bearer k2"]
    assert asked == 2


async def test_a_401_with_no_new_key_is_the_engines_answer(nursery: trio.Nursery) -> None:
    """The daemon knows no other key (or cannot be reached): the 401 goes to the caller,
    after one question to the daemon, never a loop."""
    engine, server = await start(nursery, "secret")
    calls = 0

    async def unreachable() -> dict[str, str]:
        nonlocal calls
        calls += 1
        raise Unreachable("no daemon")

    keys = KeyCache(unreachable, min_interval=3600)
    keys.learn(server.url, "stale")
    pool = UpstreamPool(read_timeout=5, keys=keys)
    assert await get(pool, server.url) == 401
    assert engine.seen == [b"Bearer stale"] and calls == 1
    assert keys.header(server.url) == b"Bearer stale"  # kept: nothing better was said


async def test_concurrent_unknown_urls_share_one_question(nursery: trio.Nursery) -> None:
    _, server = await start(nursery, "k")
    asked = 0

    async def ask() -> dict[str, str]:
        nonlocal asked
        asked += 1
        await trio.sleep(0.05)
        return {server.url: "k"}

    pool = UpstreamPool(read_timeout=5, keys=KeyCache(ask))
    results: list[int] = []

    async def one() -> None:
        results.append(await get(pool, server.url))

    async with trio.open_nursery() as n:
        for _ in range(8):
            n.start_soon(one)
    assert results == [200] * 8 and asked == 1


async def test_a_claim_without_a_key_is_believed_until_the_engine_answers_401(
    nursery: trio.Nursery,
) -> None:
    """An engine whose SGLang takes no key: its claim says so, and requests on it never
    wait for the daemon (down, each one waited out the question's timeout). A 401 from
    such a URL (a new run there, with a key) asks the daemon as any 401 does."""
    engine, server = await start(nursery, "k2")
    daemon: dict[str, str] = {}
    asked = 0

    async def ask() -> dict[str, str]:
        nonlocal asked
        asked += 1
        if not daemon:
            raise Unreachable("no daemon")
        return dict(daemon)

    keys = KeyCache(ask, min_interval=0)
    keys.learn(server.url, None)  # the claim: no key
    pool = UpstreamPool(read_timeout=5, keys=keys)
    assert keys.header(server.url) is None
    with trio.fail_after(1):
        await keys.header_for(server.url)  # known: no question
    assert asked == 0
    # The engine there does take a key after all (a new run): its 401 asks the daemon.
    daemon[server.url] = "k2"
    assert await get(pool, server.url) == 200
    assert engine.seen == [None, b"Bearer k2"] and asked == 1
    keys.learn(server.url, None)
    keys.learn(server.url, "k3")  # a later claim's key wins over the earlier "none"
    assert keys.header(server.url) == b"Bearer k3"
