"""The serving state shared by the HTTP handlers and the lifecycle tasks.

Why one small object: the lifecycle (warm-up, hang knobs, SIGUSR1, SIGTERM
drain) changes what every handler does, and the drain must know when the last
in-flight request ends. Everything waits on trio Events, never polls, so an
idle sim uses no CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

STARTING = "starting"  # bound, warming up: /v1/models 200, /health 503
UP = "up"  # warmed up: /health 200
DRAINING = "draining"  # SIGTERM received: /health 503, new generations still accepted

# SGLang's time-to-first-token buckets (seconds), a subset of its defaults.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Stats:
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


class ServerState:
    def __init__(self) -> None:
        self.status = STARTING
        self.stats = Stats()
        self.hung = False
        # SGLang installs its SIGTERM drain handler with the tokenizer manager's loop, at
        # the first request that goes through it (a generation, or /health's one token).
        self.drain_handler = False
        # /health tokens the scheduler is running (not generation requests: /sim/stats
        # and /v1/loads leave them out, but a release asserts on them too).
        self.health_active = 0
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

    def first_token(self, seconds: float) -> None:
        """One request's time to first token, into the histogram /metrics exports."""
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

    async def wait_idle(self) -> None:
        """Returns once no request is in flight."""
        while self.stats.active:
            await self._idle.wait()
