"""Keeps the state file current: written on every change, retried while it cannot be.

A record that silently failed to reach the disk (ENOSPC, EIO, a read-only
remount) is how an engine used to be lost at the next start. So a failure is
logged at ERROR in the daemon's own log (and published as a ``daemon`` event),
repeated while it lasts, and the write is retried on the next change and every
``retry_interval`` seconds until it succeeds; the recovery is logged too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import trio

from ktd.daemon.pool import statefile

log = logging.getLogger("ktd.state")

# A failure that lasts is re-logged this often (not at every retry, not never).
RELOG_EVERY = 60.0


class StateKeeper:
    def __init__(
        self,
        path: Path,
        snapshot: Callable[[], statefile.StateFile],
        *,
        on_error: Callable[[str], None] | None = None,
        retry_interval: float = 5.0,
    ) -> None:
        self.path = path
        self.snapshot = snapshot
        self.on_error = on_error
        self.retry_interval = retry_interval
        self.failures = 0  # consecutive failed attempts; 0 = the file is current
        self.error: str | None = None
        self._written: bytes | None = None
        self._last_logged = -math.inf
        self._failed = trio.Event()

    def save(self) -> bool:
        """Write the current snapshot now (skipped when the disk already has it)."""
        data = statefile.encode(self.snapshot())
        if data == self._written:
            return True
        try:
            statefile.write_bytes(self.path, data)
        except OSError as exc:
            self._failure(exc)
            return False
        if self.failures:
            log.warning(
                "state file %s written again after %d failed attempt(s)",
                self.path,
                self.failures,
            )
        self.failures = 0
        self.error = None
        self._written = data
        return True

    def _failure(self, exc: OSError) -> None:
        self.failures += 1
        msg = f"cannot write state file {self.path}: {exc.strerror or exc}"
        now = trio.current_time() if _in_trio() else 0.0
        if msg != self.error or now - self._last_logged >= RELOG_EVERY:
            log.error(
                "%s (attempt %d; the previous record is kept whole; retrying every %gs). "
                "Engines started or stopped meanwhile are still recognised by their "
                "marker after a restart.",
                msg,
                self.failures,
                self.retry_interval,
            )
            self._last_logged = now
        self.error = msg
        self._failed.set()
        if self.on_error is not None:
            self.on_error(msg)

    async def run(self) -> None:
        """Retry a failed write until it succeeds (changes retry by themselves, too)."""
        while True:
            await self._failed.wait()
            self._failed = trio.Event()
            while self.failures:
                await trio.sleep(self.retry_interval)
                self.save()


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
