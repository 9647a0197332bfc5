"""statelock: one holder per state dir, named in the refusal; released by death."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ktd.daemon import statelock


def test_second_holder_is_refused_with_the_pid(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from ktd.daemon import statelock; "
        f"statelock.acquire(Path({str(tmp_path)!r})); print('locked', flush=True); "
        "time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(statelock.StateDirBusy) as info:
            statelock.acquire(tmp_path)
        assert info.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(info.value) and str(tmp_path) in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    fd = statelock.acquire(tmp_path)  # kill -9 of the holder released it
    try:
        assert (tmp_path / statelock.LOCK_NAME).read_text() == f"{os.getpid()}\n"
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
