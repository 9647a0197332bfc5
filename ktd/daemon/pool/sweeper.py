"""Idle expiry, carried out: silent clients lose their leases and claims, idle engines go.

The decisions are ``ktd.core.expiry``'s (pause-aware, on the monotonic clock); this
task wakes when the next one is due (the client sweep every ``lease_ttl / 3``, the
soonest TTL) or when an engine changed, and carries them out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import trio

from ktd.core import states as S
from ktd.core.expiry import EvictIdle, Expiry, SleepIdle, ttl_due
from ktd.core.loads import EngineLoad
from ktd.daemon.engine.engine import Engine

log = logging.getLogger("ktd")


class Sweeper:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        lease_ttl: float,
        *,
        expire: Callable[[frozenset[str]], None],
        recall_idle: Callable[[Engine, float], object],
        engine_load: Callable[[Engine], Awaitable[EngineLoad | None]] | None = None,
    ) -> None:
        self.engines = engines
        # The engine's own count of requests (``/v1/loads``): the TTL asks it last, so a
        # stream whose holder could not report (a stopped or starved frontend) is kept.
        self._engine_load = engine_load
        self.expiry = Expiry(lease_ttl, trio.current_time())
        self._expire = expire  # the leases and claims of clients that went silent
        self._recall_idle = recall_idle  # ask claim holders back if idle that long
        self._wake = trio.Event()

    def heard(self, client: str) -> None:
        self.expiry.heard(client, trio.current_time())

    def wake(self) -> None:
        """An engine changed: a TTL may be due sooner, or no longer."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake = trio.Event()  # a change from here on makes another pass
            now = trio.current_time()
            if now >= self.expiry.next_sweep():
                paused = self.expiry.paused
                verdict = self.expiry.sweep(now)
                if self.expiry.paused != paused:
                    log.warning(
                        "the daemon did not run for a while (stopped or starved): every "
                        "client gets a fresh lease_ttl before its leases or claims expire"
                    )
                if verdict is not None:
                    self._expire(verdict.clients)
            views = [e.idle_view() for e in self.engines.values()]
            actions, next_due = self.expiry.idle(views, now)
            for action in actions:
                engine = self.engines.get(action.alias)
                if engine is None:
                    continue
                if isinstance(action, EvictIdle | SleepIdle) and await self._busy_inside(engine):
                    continue
                if isinstance(action, EvictIdle):
                    asleep = engine.state == S.ASLEEP
                    why = f"{'asleep' if asleep else 'idle'} for {action.ttl:g}s "
                    why += "(sleep_ttl)" if asleep else "(ttl)"
                    engine.log.note(f"{why}: evicting")
                    engine.request_down(reason=why)
                elif isinstance(action, SleepIdle):
                    why = f"idle for {action.ttl:g}s (ttl)"
                    engine.log.note(f"{why}: going to sleep")
                    engine.request_sleep(reason=why)
                else:
                    self._recall_idle(engine, action.idle)
            until = min(self.expiry.next_sweep(), next_due)  # the sweep's time is finite
            now = trio.current_time()
            with trio.move_on_at(max(until, now + 0.01)):
                await self._wake.wait()

    async def _busy_inside(self, engine: Engine) -> bool:
        """The TTL ran out by what its holders reported; the engine itself still counts a
        request running or waiting (a frontend stalled past ``lease_ttl`` lost its claim,
        its stream did not end): the engine counts as used now, and stays."""
        if self._engine_load is None or engine.state != S.READY:
            return False
        reading = await self._engine_load(engine)
        due = ttl_due(engine.idle_view())
        if due is None or due > trio.current_time():
            return True  # used (or going) meanwhile: nothing to do now
        if reading is None or reading.quiet:
            return False
        engine.log.note(
            f"ttl: the engine still counts {reading.requests} request(s) "
            f"({reading.tokens} KV tokens) in flight: kept"
        )
        engine.used(ago=0, busy=True)
        return True
