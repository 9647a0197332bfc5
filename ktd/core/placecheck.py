"""Placements that can never succeed on this machine are config errors, found at load time.

Why: ``"numa": [7]`` on a one-node machine, or ``"gpus": 4`` on a box with two,
fails the same way on every launch. Reported at request time it looked like
"busy" (503 + Retry-After), so clients retried forever and ``ktd serve``
started without a word. Checked at ``ktd serve`` and at every reload instead,
as a :class:`~ktd.core.config.ConfigError` naming the file and the field.

Each request is planned alone on an empty machine, NUMA and GPUs separately,
so the error names the field at fault. A GPU request is only refused when the
GPUs were really counted (``nvidia-smi`` answered); when they could not be,
the launch is left to try. Pure given the topology.
"""

from __future__ import annotations

from ktd.core.config import Config, ConfigError, ModelSpec
from ktd.core.ktflags import NUMA_FLAG, POOL_FLAG, TP_FLAGS
from ktd.core.placement import plan
from ktd.core.topology import Topology
from ktd.core.userflags import user_flags


def _where(spec: ModelSpec) -> tuple[str, str]:
    """(file, field path prefix) of a model's entry, from its ``source``."""
    file, sep, path = spec.source.rpartition(": ")
    return (file, path) if sep else (spec.source, "$")


def _field(spec: ModelSpec, base: str, name: str) -> str:
    if base.endswith(".ktransformers"):
        return f"{base}.extra_args" if name == "extra_args" else base
    return f"{base}.{'kt.extra_args' if name == 'extra_args' else name}"


def check_spec(spec: ModelSpec, topo: Topology) -> None:
    """Raise ConfigError if ``spec`` could not be placed even on an idle machine."""
    file, base = _where(spec)
    uflags = user_flags(spec.extra_args)
    numa_plan = plan(spec.alias, spec.numa, 0, spec.extra_args, topo, (), tp_size=spec.tp_size)
    if not numa_plan.ok and numa_plan.impossible:
        in_args = NUMA_FLAG in uflags or (POOL_FLAG in uflags and spec.numa == "auto")
        raise ConfigError(
            file, _field(spec, base, "extra_args" if in_args else "numa"), numa_plan.reason or ""
        )
    if topo.gpu_error is None:
        gpu_plan = plan(
            spec.alias, "none", spec.gpus, spec.extra_args, topo, (), tp_size=spec.tp_size
        )
        if not gpu_plan.ok and gpu_plan.impossible:
            tp_in_args = spec.gpus == "auto" and any(f in uflags for f in TP_FLAGS)
            name = "extra_args" if tp_in_args else "gpus"
            if spec.gpus == "auto" and spec.tp_size is not None:
                name = "kt.tp_size"
            raise ConfigError(file, _field(spec, base, name), gpu_plan.reason or "")


def check_placements(config: Config, topo: Topology) -> None:
    """Every served model of ``config`` must be placeable on ``topo``; ConfigError if not."""
    for spec in config.served():
        check_spec(spec, topo)
