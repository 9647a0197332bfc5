"""The daemon's probe of an engine's Python: run under trio, and cached.

What is asked and how the answer is read is :mod:`ktd.pyprobe` (ktctl's local
doctor runs it too); its names are re-exported here for the daemon's modules.
Successes are cached per (interpreter, engine environment); failures are not,
so an operator who installs the missing package needs no daemon restart. A
reload and doctor forget the cache (a venv may have been upgraded meanwhile).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import trio

from ktd.pyprobe import (
    KT_FORK,
    PROBE_CODE,
    UPSTREAM,
    ProbeResult,
    missing_message,
    parse_probe_output,
)

__all__ = [
    "KT_FORK",
    "PROBE_CODE",
    "UPSTREAM",
    "ProbeResult",
    "Prober",
    "env_key",
    "missing_message",
    "parse_probe_output",
    "run_probe",
]


def env_key(python: str, env: Mapping[str, str]) -> tuple[str, str]:
    """The cache key: the interpreter and everything in its environment but ktd's own
    per-launch markers (engine id, launch digest)."""
    from ktd.core.command import DIGEST_MARK, ENGINE_MARK

    items = sorted((k, v) for k, v in env.items() if k not in (ENGINE_MARK, DIGEST_MARK))
    return python, hashlib.sha256(json.dumps(items).encode()).hexdigest()


class Prober:
    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], ProbeResult] = {}
        self._locks: dict[tuple[str, str], trio.Lock] = {}

    def forget(self) -> None:
        self._cache.clear()

    def cached(self, python: str, env: Mapping[str, str]) -> ProbeResult | None:
        return self._cache.get(env_key(python, env))

    async def probe(
        self, python: str, env: Mapping[str, str], *, timeout: float = 120.0
    ) -> ProbeResult:
        key = env_key(python, env)
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
            result = await run_probe(python, env, timeout=timeout)
            if result.complete:
                self._cache[key] = result
            return result


async def run_probe(python: str, env: Mapping[str, str], *, timeout: float = 120.0) -> ProbeResult:
    try:
        with trio.fail_after(timeout):
            proc = await trio.run_process(
                [python, "-c", PROBE_CODE],
                env=dict(env),
                capture_stdout=True,
                stderr=-2,  # subprocess.STDOUT
                check=False,
                stdin=b"",
            )
    except FileNotFoundError:
        return ProbeResult(python=python, ok_python=False, error=f"{python}: no such interpreter")
    except PermissionError:
        return ProbeResult(python=python, ok_python=False, error=f"{python}: not executable")
    except trio.TooSlowError:
        return ProbeResult(
            python=python, ok_python=False, error=f"probe of {python} timed out after {timeout:g}s"
        )
    return parse_probe_output(python, proc.returncode, proc.stdout.decode(errors="replace"))
