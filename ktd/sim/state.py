"""The serving state shared by the HTTP handlers and the lifecycle tasks.

Why one small object: the lifecycle (warm-up, hang knobs, SIGUSR1, SIGTERM
drain) changes what every handler does, and the drain must know when the last
in-flight request ends. Everything waits on trio Events, never polls, so an
idle sim uses no CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

STARTING = "starting"  # bound, warming up: /v1/models 200, /health 503
UP = "up"  # warmed up: /health 200
DRAINING = "draining"  # SIGTERM received: /health 503, new generations still accepted


@dataclass
class Stats:
    """``GET /sim/stats``. Always ``requests == active + completed + aborted``."""

    requests: int = 0  # generation requests received (chat, completions, embeddings)
    active: int = 0  # of those, still being answered
    completed: int = 0  # answered to the end (error replies included)
    aborted: int = 0  # cut short because the client went away
    streams: int = 0  # of the requests, how many were streaming

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "active": self.active,
            "completed": self.completed,
            "aborted": self.aborted,
            "streams": self.streams,
        }


class ServerState:
    def __init__(self) -> None:
        self.status = STARTING
        self.stats = Stats()
        self.hung = False
        self._unhung = trio.Event()
        self._unhung.set()
        self._idle = trio.Event()
        self._idle.set()

    # -- hang (KTD_SIM_HANG_AFTER, SIGUSR1)
    def set_hung(self, hung: bool) -> None:
        if hung == self.hung:
            return
        self.hung = hung
        if hung:
            self._unhung = trio.Event()
        else:
            self._unhung.set()

    async def wait_unhung(self) -> None:
        while self.hung:
            await self._unhung.wait()

    # -- request accounting
    def begin(self) -> None:
        self.stats.requests += 1
        self.stats.active += 1
        if self.stats.active == 1:
            self._idle = trio.Event()

    def mark_stream(self) -> None:
        self.stats.streams += 1

    def end(self, aborted: bool) -> None:
        self.stats.active -= 1
        if aborted:
            self.stats.aborted += 1
        else:
            self.stats.completed += 1
        if self.stats.active == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Returns once no request is in flight."""
        while self.stats.active:
            await self._idle.wait()
