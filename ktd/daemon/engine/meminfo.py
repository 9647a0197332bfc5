"""What an engine's processes hold now: on each GPU (nvidia-smi) and on each NUMA node
(``/proc/PID/numa_maps``). Read after a release (the residue an asleep engine keeps on
its GPUs, which every later fit counts) and by ``ktctl sleep --verify`` (where the
memory was before the sleep, asleep, and after the wake). Blocking: run in a thread.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

from ktd.core.topology import (
    NVIDIA_SMI_APPS,
    NVIDIA_SMI_TIMEOUT,
    NVIDIA_SMI_UUIDS,
    parse_gpu_use,
    parse_numa_maps,
)
from ktd.daemon.engine.proctree import PROC
from ktd.daemon.engine.weights import nvidia_smi_cmd

__all__ = ["gpu_use", "host_use"]


def gpu_use(pids: Iterable[int]) -> dict[int, int] | None:
    """Bytes the processes ``pids`` hold on each GPU, as nvidia-smi says; None when it
    cannot say (no nvidia-smi, no GPUs, an answer of another shape)."""
    cmd = nvidia_smi_cmd()
    if cmd is None:
        return None
    answers = []
    for query in (NVIDIA_SMI_UUIDS, NVIDIA_SMI_APPS):
        try:
            proc = subprocess.run(
                [*cmd, *query],
                capture_output=True,
                text=True,
                timeout=NVIDIA_SMI_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        answers.append(proc.stdout)
    try:
        return parse_gpu_use(answers[0], answers[1], pids)
    except ValueError:
        return None


def host_use(pids: Iterable[int]) -> dict[int, int]:
    """Bytes the processes ``pids`` have resident on each NUMA node (a page shared by two
    of them counts twice); a process gone meanwhile counts nothing."""
    use: dict[int, int] = {}
    for pid in pids:
        try:
            text = (PROC / str(pid) / "numa_maps").read_text()
        except OSError:
            continue
        for node, n in parse_numa_maps(text).items():
            use[node] = use.get(node, 0) + n
    return use
