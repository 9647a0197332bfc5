"""One engine's process tree as the daemon knows it: spawned by this daemon, or adopted.

Apart from the supervisor (engine.py) because the killing (kill.py), the spawning
(spawn.py) and the pool's adoption all speak of it, and none of them needs Engine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ktd.daemon.engine import proctree


@dataclass
class Running:
    """One spawned (or adopted) engine process tree."""

    pid: int
    start: int
    engine_id: str
    port: int
    argv: list[str]
    proc: trio.Process | None = None
    pidfd: int | None = None
    returncode: int | None = None
    exited: trio.Event = field(default_factory=trio.Event)
    started_at: float = field(default_factory=time.time)
    digest: str = ""  # the spec's launch digest when it was started
    adopted_state: str | None = None  # state recorded by the daemon that started it
    adopted_step: str | None = None  # and the step of that state
    sleeps: bool = False  # launched with SGLang's memory saver: it can sleep
    # Its API key (every request of ktd's carries it) and the 0600 file SGLang read it
    # from, removed when the run ends (``ktd.daemon.engine.key``). Never in status.
    api_key: str | None = field(default=None, repr=False)
    # The user's --admin-api-key: what SGLang's admin-level routes (a sleep's calls) want.
    admin_key: str | None = field(default=None, repr=False)
    key_file: Path | None = None

    async def wait(self) -> None:
        if self.proc is not None:
            self.returncode = await self.proc.wait()
        elif self.pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(self.pidfd)
            except trio.ClosedResourceError:
                pass  # close() after _kill_everything saw the tree gone (e.g. a forced evict)
        else:  # no pidfd (old kernel): poll
            while proctree.alive((self.pid, self.start)):
                await trio.sleep(0.5)
        self.exited.set()

    def close(self) -> None:
        if self.pidfd is not None:
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
