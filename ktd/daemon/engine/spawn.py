"""Starting an engine's processes: the ``ktd.pin`` wrapper, the logged spawn, pip.

Apart from the supervisor because these are the exact command lines and file
descriptors an engine is started with; the supervisor only decides *when*.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from ktd.daemon.engine.log import EngineLog
from ktd.daemon.engine.probe import KT_FORK

__all__ = ["KTD_ROOT", "open_logged", "pinned", "pip_install_argv"]

#: Where ktd itself is importable from: ``ktd.pin`` runs in the engine's interpreter.
KTD_ROOT = str(Path(__file__).resolve().parents[2])


def pinned(
    argv: list[str], env: dict[str, str], *, cpus: Sequence[int], mems: Sequence[int]
) -> tuple[list[str], dict[str, str]]:
    """``argv`` behind ``python -m ktd.pin`` when there is anything to pin it to
    (else unchanged), and the environment that lets ``ktd.pin`` import."""
    if not cpus and not mems:
        return list(argv), env
    pin = [sys.executable, "-m", "ktd.pin"]
    if cpus:
        pin += ["--cpus", ",".join(map(str, cpus))]
    if mems:
        pin += ["--mems", ",".join(map(str, mems))]
    env = dict(env)
    # ktd.pin must import from where ktd lives, whatever the engine's PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), KTD_ROOT) if p)
    return [*pin, "--", *argv], env


def pip_install_argv(python: str, kt_kernel: str | None) -> list[str]:
    """``auto_build``: the kt fork (``sglang-kt``), never upstream ``sglang``, whose kt
    wrapper does not match kt-kernel's API. The installed kt-kernel is pinned so pip
    cannot replace it: ktd never installs kt-kernel."""
    cmd = [python, "-m", "pip", "install", KT_FORK]
    if kt_kernel and re.fullmatch(r"\d+(\.\d+)*", kt_kernel):
        cmd.append(f"kt-kernel=={kt_kernel}")
    return cmd


async def open_logged(
    log: EngineLog, cmd: list[str], env: dict[str, str], *, note: str, no_log: int
) -> trio.Process:
    """Start ``cmd`` in a new session, stdout+stderr to the engine's log file (to
    ``no_log`` when the file cannot be opened), followed from ``note`` on."""
    fd = log.open_for_engine()
    log.start_following(from_end=True)
    log.note(note)
    try:
        return await trio.lowlevel.open_process(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd if fd is not None else no_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if fd is not None:
            os.close(fd)
