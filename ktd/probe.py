"""Does the engine's Python have SGLang and kt-kernel? Asked in a subprocess of that Python.

The engine usually runs in another venv than ktd, so only that interpreter
can answer. Successes are cached per (interpreter, PYTHONPATH); failures are
not, so an operator who installs the missing package needs no daemon restart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec
import trio

PROBE_CODE = r"""
import json, sys
out = {"python": sys.executable, "version": sys.version.split()[0]}
for name in ("sglang", "kt_kernel"):
    try:
        mod = __import__(name)
        out[name] = str(getattr(mod, "__version__", "unknown"))
    except Exception as exc:
        out[name] = None
        out[name + "_error"] = f"{type(exc).__name__}: {exc}"
try:
    import kt_kernel
    out["kt_variant"] = str(getattr(kt_kernel, "__cpu_variant__", ""))
except Exception:
    pass
print("KTD_PROBE " + json.dumps(out))
"""


class ProbeResult(msgspec.Struct, kw_only=True):
    python: str
    ok_python: bool = True
    version: str | None = None
    sglang: str | None = None
    kt_kernel: str | None = None
    kt_variant: str | None = None
    sglang_error: str | None = None
    kt_kernel_error: str | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.sglang is not None and self.kt_kernel is not None


def parse_probe_output(python: str, returncode: int, output: str) -> ProbeResult:
    for line in output.splitlines():
        if line.startswith("KTD_PROBE "):
            try:
                data = json.loads(line[len("KTD_PROBE ") :])
            except ValueError:
                break
            return ProbeResult(
                python=python,
                version=data.get("version"),
                sglang=data.get("sglang"),
                kt_kernel=data.get("kt_kernel"),
                kt_variant=data.get("kt_variant") or None,
                sglang_error=data.get("sglang_error"),
                kt_kernel_error=data.get("kt_kernel_error"),
            )
    tail = " | ".join(output.strip().splitlines()[-3:])
    return ProbeResult(
        python=python, ok_python=False, error=f"probe exited {returncode}: {tail or 'no output'}"
    )


class Prober:
    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], ProbeResult] = {}
        self._locks: dict[tuple[str, str], trio.Lock] = {}

    def forget(self) -> None:
        self._cache.clear()

    async def probe(
        self, python: str, env: Mapping[str, str], *, timeout: float = 120.0
    ) -> ProbeResult:
        key = (python, env.get("PYTHONPATH", ""))
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


def missing_message(result: ProbeResult, *, auto_build: bool) -> str | None:
    """The actionable sentence for a load that cannot start, or None when it may go on.

    kt-kernel is checked first: it is never installed by ktd, so pip-installing
    SGLang for an engine that cannot run anyway would waste minutes.
    """
    if not result.ok_python:
        return f"cannot run the engine's Python: {result.error}"
    problems = []
    if result.kt_kernel is None:
        problems.append(
            f"kt_kernel is not importable in {result.python} ({result.kt_kernel_error}); ktd never "
            "builds or installs kt-kernel: install it out of band (see the ktransformers "
            "kt-kernel install guide), then load again"
        )
    if result.sglang is None and (not auto_build or problems):
        problems.append(
            f"sglang is not importable in {result.python} ({result.sglang_error}); install the kt "
            f"fork of SGLang into that environment (`{result.python} -m pip install sglang`), "
            "or point `ktransformers.python` at its venv, or set `ktransformers.auto_build: true`"
        )
    return "; ".join(problems) or None
