"""How the pool runs blocking work (``/proc``, ``nvidia-smi``, weight headers) off the
trio thread: a value it carries, ``trio.to_thread.run_sync`` in the daemon.

A value rather than a call written at each site so that a test running the pool on
trio's virtual clock can run that work inline: a task waiting on a worker thread looks
to an autojumping clock like a task blocked on nothing, and the clock jumped past
health checks and lease timeouts while the thread ran (hundreds of virtual seconds in a
real millisecond on a busy box)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

T = TypeVar("T")


class Offload(Protocol):
    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


async def to_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """The daemon's: a worker thread from trio's default limiter."""
    return await trio.to_thread.run_sync(fn, *args)
