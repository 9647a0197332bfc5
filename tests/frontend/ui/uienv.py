"""A box for the dashboard to draw: two NUMA nodes, two GPUs, three models. Importable.

The nodes are a sysfs fixture whose CPUs are this machine's own 0 and 1 (one per
node), so engines placed on them really are pinned there; the GPUs are a fake
``nvidia-smi``. ``alpha`` and ``beta`` are sim engines on a node and a GPU each
(``alpha`` with ``--enable-metrics``, so the dashboard reads its tokens);
``qwen3`` is an entry of another backend, listed and never served.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ktd.sim.model import make_model
from tests.fixtures.topology import BASE_FLAGS, GIB_KB, FakeMachine, build, smi_script

REPO = Path(__file__).resolve().parents[3]
SHIM = REPO / "ktd" / "sim" / "shim"
GPUS = [(0, "NVIDIA L40S", 46068, 1210), (1, "NVIDIA L40S", 46068, 9)]


def two_node_box(root: Path) -> Path:
    machine = FakeMachine(
        model="Fake Xeon (2 nodes, one CPU each)",
        flags=BASE_FLAGS,
        nodes={0: [0], 1: [1]},
        core_of={0: (0, 0), 1: (1, 0)},
        mem_total_kb={0: 256 * GIB_KB, 1: 256 * GIB_KB},
        mem_free_kb={0: 190 * GIB_KB, 1: 230 * GIB_KB},
    )
    return build(root, machine)


def machine_env(root: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the daemon pointed at the fixture box and the fake nvidia-smi."""
    sysfs = two_node_box(root / "machine")
    smi = smi_script(root / "nvidia-smi", GPUS)
    return {**env, "KTD_SYSFS_ROOT": str(sysfs), "KTD_NVIDIA_SMI": str(smi)}


def sim_entry(models: Path, alias: str, **over: Any) -> dict[str, Any]:
    env = {
        "PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))),
        "KTD_SIM_LOAD_TIME": str(over.pop("load_time", 0.2)),
        "KTD_SIM_TOKEN_RATE": str(over.pop("token_rate", 0)),
    }
    model_path, weights = make_model(models, alias)
    entry: dict[str, Any] = {
        "path": model_path,
        "backend": "kt",
        "alias": alias,
        "kt": {"extra_env": env, "kt_weight_path": weights, "extra_args": over.pop("args", [])},
    }
    entry.update(over)
    return entry


def box_models(models: Path, **alpha: Any) -> list[dict[str, Any]]:
    return [
        sim_entry(models, "alpha", numa=[0], gpus=[0], args=["--enable-metrics"], **alpha),
        sim_entry(models, "beta", numa=[1], gpus=[1], ttl=600),
        {"path": str(models / "qwen3"), "backend": "ds4", "alias": "qwen3"},
    ]
