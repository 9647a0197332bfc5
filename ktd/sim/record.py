"""``KTD_SIM_RECORD``: what the engine process saw at start-up, as JSON.

Why: tests of ktd's exact command line, environment and CPU pinning need the
view from inside the engine, not from the daemon that built it. The file is
replaced atomically (write a temporary file, then rename) so a reader polling
for it never sees half a document; later rewrites only add fields.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

ENV_PREFIXES = ("KT", "SGLANG")
ENV_KEYS = ("CUDA_VISIBLE_DEVICES",)


def selected_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """KT* (so KT_*, KTD_*, KTD_SIM_*), SGLANG* and CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) or k in ENV_KEYS}


def _cmdline() -> list[str]:
    """The real command line, ``python -m sglang.launch_server ...`` form included."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return [sys.executable, *sys.argv]
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def snapshot(extra: Mapping[str, object] | None = None) -> dict[str, object]:
    data: dict[str, object] = {
        "argv": list(sys.argv),
        "args": list(sys.argv[1:]),
        "cmdline": _cmdline(),
        "executable": sys.executable,
        "env": selected_env(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "cwd": os.getcwd(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
    }
    data.update(extra or {})
    return data


def write(path: str, data: Mapping[str, object]) -> None:
    """Atomic replace; errors are reported to the caller (start-up logs them)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
