"""The serving state shared by the HTTP handlers and the lifecycle tasks.

Why one small object: the lifecycle (warm-up, hang knobs, SIGUSR1, SIGTERM
drain) changes what every handler does, and the drain must know when the last
in-flight request ends. Everything waits on trio Events, never polls, so an
idle sim uses no CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import trio

STARTING = "starting"  # bound, warming up: /v1/models 200, /health 503
UP = "up"  # warmed up: /health 200
DRAINING = "draining"  # SIGTERM received: /health 503, new generations still accepted

# SGLang's time-to-first-token buckets (seconds), a subset of its defaults.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class SimStats:
    """``GET /sim/stats``. Always ``requests == active + completed + aborted``."""

    requests: int = 0  # generation requests received (chat, completions, embeddings)
    active: int = 0  # of those, still being answered
    completed: int = 0  # answered to the end (error replies included)
    aborted: int = 0  # cut short because the client went away
    streams: int = 0  # of the requests, how many were streaming
    prompt_tokens: int = 0  # SGLang's sglang:prompt_tokens_total
    generation_tokens: int = 0  # sglang:generation_tokens_total
    # sglang:time_to_first_token_seconds: per bucket of TTFT_BUCKETS, then the sum
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "active": self.active,
            "completed": self.completed,
            "aborted": self.aborted,
            "streams": self.streams,
        }


class Aborted(Exception):
    """The request was aborted by ``/pause_generation``'s ``abort`` mode (``abort_all``)."""


#: Decode steps between two load snapshots (``--load-snapshot-publish-interval``).
PUBLISH_INTERVAL = 15
#: KV tokens a request holds in the sim's count (prompt and cache, as a round figure).
REQUEST_TOKENS = 32


class ServerState:
    def __init__(self, *, hold: bool = False) -> None:
        self.status = STARTING
        self.stats = SimStats()
        self.hung = False
        # SGLang installs its SIGTERM drain handler with the tokenizer manager's loop, at
        # the first request that goes through it (a generation, or /health's one token).
        self.drain_handler = False
        # /health tokens the scheduler is running (not generation requests: /sim/stats
        # and /v1/loads leave them out, but a release asserts on them too).
        self.health_active = 0
        # The load snapshot upstream SGLang's scheduler publishes for /v1/loads: after a
        # prefill (a first token), every PUBLISH_INTERVAL decode steps, and when it goes
        # idle; a request that arrived since is in no snapshot. (requests, tokens, time)
        self.snapshot: tuple[int, int, float] = (0, 0, time.time())
        self._steps = 0
        self.abort_epoch = 0  # abort_all() calls: a request begun before one is aborted
        self._unhung = trio.Event()
        self._unhung.set()
        self._idle = trio.Event()
        self._idle.set()
        self._gate = trio.Event()  # KTD_SIM_HOLD: closed until a test opens it
        if not hold:
            self._gate.set()

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

    # -- the test's gate (KTD_SIM_HOLD)
    def set_gate(self, open_: bool) -> None:
        if open_:
            self._gate.set()
        elif self._gate.is_set():
            self._gate = trio.Event()

    async def wait_gate(self) -> None:
        await self._gate.wait()

    # -- the scheduler's load count
    def in_scheduler(self) -> int:
        """Requests the scheduler holds now: generations and ``/health`` tokens."""
        return self.stats.active + self.health_active

    def publish(self) -> None:
        n = self.in_scheduler()
        self.snapshot = (n, n * REQUEST_TOKENS, time.time())

    def live_load(self) -> tuple[int, int, float]:
        """What the kt fork counts: it asks the scheduler between two batches. (The fork
        leaves the request whose prefill just ended out of its running count for one
        loop; the sim counts it: its KV tokens give it away either way.)"""
        n = self.in_scheduler()
        return (n, n * REQUEST_TOKENS, time.time())

    def abort_all(self) -> None:
        """``AbortReq(abort_all=True)``: every request in flight ends at its next step."""
        self.abort_epoch += 1

    # -- request accounting
    def begin(self) -> None:
        self.drain_handler = True
        self.stats.requests += 1
        self.stats.active += 1
        if self.stats.active == 1:
            self._idle = trio.Event()

    def mark_stream(self) -> None:
        self.stats.streams += 1

    def tokens(self, prompt: int = 0, generated: int = 0) -> None:
        self.stats.prompt_tokens += prompt
        self.stats.generation_tokens += generated
        if generated:
            self._steps += 1
            if self._steps % PUBLISH_INTERVAL == 0:
                self.publish()

    def first_token(self, seconds: float) -> None:
        """One request's time to first token, into the histogram /metrics exports; its
        prefill ended, so the scheduler publishes a load snapshot."""
        self.publish()
        stats = self.stats
        stats.ttft_sum += seconds
        stats.ttft_count += 1
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                stats.ttft_counts[i] += 1

    def end(self, aborted: bool) -> None:
        self.stats.active -= 1
        if aborted:
            self.stats.aborted += 1
        else:
            self.stats.completed += 1
        if self.stats.active == 0:
            self._idle.set()
        if not self.in_scheduler():
            self.publish()  # idle: the scheduler publishes at once

    async def wait_idle(self) -> None:
        """Returns once no request is in flight."""
        while self.stats.active:
            await self._idle.wait()
