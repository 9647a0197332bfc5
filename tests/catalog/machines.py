"""The two described machines of issue 44's closing note, as fixture trees and a fake
nvidia-smi (``$KTD_SYSFS_ROOT`` and ``$KTD_NVIDIA_SMI`` for a daemon; the same tree read
in process for the pure functions):

* ``amx_box``: two Xeon sockets with AMX (16 physical cores, 2 NUMA nodes of 512 GiB),
  one 48 GB GPU (an L20, the GPU of kt's DeepSeek V3.2 tutorial);
* ``avx2_box``: one AVX2-only socket without AVX-512 (a Zen 2 Threadripper: 32 cores,
  64 threads, one NUMA node of 256 GiB), one 24 GB GPU (an RTX 4090).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ktd.core.topology import Topology
from ktd.topology import read_topology
from tests.fixtures.topology import BASE_FLAGS, GIB_KB, FakeMachine, build, smi_script, xeon_machine

AMX_GPUS = [(0, "NVIDIA L20", 49140, 512)]
AVX2_GPUS = [(0, "NVIDIA GeForce RTX 4090", 24564, 300)]


def amx_machine() -> FakeMachine:
    m = xeon_machine()
    return dataclasses.replace(
        m,
        mem_total_kb={0: 512 * GIB_KB, 1: 512 * GIB_KB},
        mem_free_kb={0: 480 * GIB_KB, 1: 500 * GIB_KB},
    )


def avx2_machine() -> FakeMachine:
    core_of = {c: (0, c % 32) for c in range(64)}
    return FakeMachine(
        model="AMD Ryzen Threadripper 3970X 32-Core Processor",
        flags=BASE_FLAGS,
        nodes={0: list(range(64))},
        core_of=core_of,
        mem_total_kb={0: 256 * GIB_KB},
        mem_free_kb={0: 240 * GIB_KB},
    )


def tree(
    root: Path, machine: FakeMachine, gpus: list[tuple[int, str, int, int]]
) -> tuple[Path, Path]:
    """The machine's sysfs/procfs under ``root/fs`` and its nvidia-smi at ``root/nvidia-smi``."""
    fs = build(root / "fs", machine)
    return fs, smi_script(root / "nvidia-smi", gpus)


def amx_box(root: Path) -> Topology:
    fs, smi = tree(root, amx_machine(), AMX_GPUS)
    return read_topology(fs, nvidia_smi=[str(smi)])


def avx2_box(root: Path) -> Topology:
    fs, smi = tree(root, avx2_machine(), AVX2_GPUS)
    return read_topology(fs, nvidia_smi=[str(smi)])
