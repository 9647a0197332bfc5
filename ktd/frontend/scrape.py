"""Fetch each ready engine's own ``/metrics`` (SGLang's Prometheus text), concurrently.

Why its own module: the frontend's ``/metrics`` is one scrape target for the
whole machine; this is the I/O half (promtext.py is the pure merge). Each
engine gets ``timeout`` seconds; one that fails, times out or has metrics off
(404) is left out of this scrape rather than failing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from ktd import protocol as p
from ktd.core import states as S
from ktd.frontend.upstream import UpstreamError, UpstreamPool

MAX_BYTES = 8 << 20


async def scrape_engines(
    pool: UpstreamPool,
    engines: Sequence[p.EngineInfo],
    timeout: float = 2.0,
    *,
    path: bytes = b"/metrics",
) -> list[tuple[str, str]]:
    """``[(alias, exposition text), ...]`` for ready engines that answered 200.

    ``path``: the dashboard's sampler asks ``/metrics?ktd=probe``, so its requests
    count among ktd's own probes in the engine's log (hidden by default).
    """
    results: dict[str, str] = {}

    async def one(alias: str, url: str) -> None:
        with trio.move_on_after(timeout):
            try:
                resp = await pool.request(url, path, [], b"", method=b"GET")
                try:
                    data = await resp.read() if resp.status == 200 else b""
                finally:
                    resp.close()
            except UpstreamError:
                return
            if data and len(data) <= MAX_BYTES:
                results[alias] = data.decode("utf-8", "replace")

    async with trio.open_nursery() as nursery:
        for e in engines:
            if e.state == S.READY and e.url:
                nursery.start_soon(one, e.alias, e.url)
    return [(e.alias, results[e.alias]) for e in engines if e.alias in results]
