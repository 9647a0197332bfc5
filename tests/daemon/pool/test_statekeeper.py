"""StateKeeper: a failed state write is logged, retried, and never half-written."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from ktd.daemon.pool import statefile
from ktd.daemon.pool.statekeeper import StateKeeper


def test_failure_is_logged_retried_and_recovered(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "engines.json"
    state = {"n": 0}
    errors: list[str] = []

    def snapshot() -> statefile.StateFile:
        return statefile.StateFile(daemon_pid=state["n"])

    keeper = StateKeeper(path, snapshot, on_error=errors.append, retry_interval=0.01)
    assert keeper.save() and statefile.read(path).daemon_pid == 0
    full = {"on": True}
    real = statefile.write_bytes

    def maybe_full(p: Path, data: bytes) -> None:
        if full["on"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(p, data)

    monkeypatch.setattr(statefile, "write_bytes", maybe_full)
    caplog.set_level(logging.WARNING, logger="ktd.state")

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(keeper.run)
            state["n"] = 1
            assert not keeper.save()
            await trio.sleep(0.1)  # several retries, all failing
            assert keeper.failures > 1
            full["on"] = False
            while keeper.failures:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()

    trio.run(main)
    assert statefile.read(path).daemon_pid == 1
    assert errors and "No space left on device" in errors[0]
    text = caplog.text
    assert "cannot write state file" in text and "ERROR" in text
    assert "written again after" in text
    # Logged once for the lasting failure, not at every retry.
    assert text.count("cannot write state file") == 1


def test_unchanged_snapshot_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    keeper = StateKeeper(path, statefile.StateFile)
    assert keeper.save()
    before = path.stat().st_mtime_ns, path.stat().st_ino
    assert keeper.save()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
