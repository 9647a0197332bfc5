"""Exec wrapper that pins an engine: ``python -m ktd.pin --cpus 0-7 --mems 0 -- ARGV``.

Affinity and the memory policy must be set in the child before exec, so that
SGLang's scheduler and every thread it starts inherit them. ``preexec_fn`` is
unsafe in a threaded parent, and setting them after spawn races the engine's
own children; an exec wrapper has neither problem and costs one interpreter
start (tens of milliseconds against minutes of model load).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

MPOL_BIND = 2
# set_mempolicy(2) syscall numbers.
_SYSCALL = {"x86_64": 238, "aarch64": 237}


def parse_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def bind_memory(nodes: list[int]) -> str | None:
    """Bind memory to ``nodes`` with set_mempolicy(MPOL_BIND). Returns an error string or None."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None or not nodes:
        return f"set_mempolicy unsupported on {platform.machine()}"
    maxnode = max(nodes) + 2
    words = (maxnode + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, MPOL_BIND, mask, ctypes.c_ulong(maxnode)) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def main(argv: list[str]) -> int:
    cpus: list[int] = []
    mems: list[int] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--cpus":
            cpus = parse_list(argv[i + 1])
        elif argv[i] == "--mems":
            mems = parse_list(argv[i + 1])
        else:
            print(f"ktd.pin: unknown option {argv[i]}", file=sys.stderr)
            return 2
        i += 2
    cmd = argv[i + 1 :]
    if not cmd:
        print("ktd.pin: no command after --", file=sys.stderr)
        return 2
    if cpus:
        os.sched_setaffinity(0, cpus)
    if mems:
        err = bind_memory(mems)
        if err:
            print(f"[ktd] warning: memory not bound to NUMA nodes {mems}: {err}", flush=True)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"ktd.pin: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
