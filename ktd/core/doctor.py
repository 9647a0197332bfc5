"""``ktctl doctor``: checks that catch kt-kernel's usual failures before a 5-minute load does.

The checks are pure functions of a :class:`~ktd.core.topology.Topology`, a
:class:`~ktd.core.config.ModelSpec` and a probe result dict; filesystem and socket
look-ups are injectable callables. The part that runs the probe subprocess in
the engine's interpreter lives elsewhere, so everything here is testable on a
laptop against fixture machines.

The machine's own checks (CPU, NUMA, GPUs) are ``ktd.core.machinecheck``'s: they
need no config and run alone when there is none. This module adds a model entry's
checks and the engines' interpreter's, and gathers every family in display order
(``collect``) into the report ``ktctl doctor`` prints.

The checks target what users of kt-kernel actually trip over (docs/sglang.md):
illegal instruction on CPUs without AMX, an SGLang that is not the kt fork, no
``--kt-num-gpu-experts`` (kt is silently off and the GPU runs out of memory),
NUMA off in the BIOS, and a fixed port that is already taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ktd.core.command import LaunchError, build_launch, planner_args
from ktd.core.config import ModelSpec
from ktd.core.machinecheck import cpu_checks, gpu_checks, numa_checks
from ktd.core.placement import plan
from ktd.core.sglang_options import SGLangOptions
from ktd.core.topology import Topology
from ktd.core.userflags import user_flags
from ktd.core.verdict import Check, Verdicts

__all__ = ["collect", "model_checks", "python_checks", "report"]

MAX_SANE_CTX = 1_048_576
GPU_EXPERT_FLAGS = ("--kt-num-gpu-experts", "--kt-gpu-experts-ratio")
AMX_METHODS = ("AMXINT4", "AMXINT8")
DEFAULT_KT_METHOD = "AMXINT4"


# ---------------------------------------------------------------- model


def model_checks(
    spec: ModelSpec,
    *,
    port_free: Callable[[str, int], bool],
    exists: Callable[[str], bool] = os.path.exists,
    topo: Topology | None = None,
    running: bool = False,
) -> list[Check]:
    """Per-model checks; names are ``<alias>.<field>`` so the operator knows what to edit.

    ``running`` = the model's engine is up, so its fixed port is expected to
    be taken. With ``topo``, the kt method is checked against the CPU and the
    placement is planned on an empty machine (config errors such as an unknown
    NUMA node show up here, not at 3 a.m. on first load).
    """
    uf = user_flags(spec.extra_args)
    checks = [
        _path_check(spec, exists),
        _weight_check(spec, uf, exists),
        _gpu_experts_check(spec, uf),
        _ctx_check(spec),
        _port_check(spec, port_free, running),
    ]
    if topo is not None:
        checks.extend(_method_check(spec, uf, topo))
        checks.extend(_placement_check(spec, topo))
    return checks


def _path_check(spec: ModelSpec, exists: Callable[[str], bool]) -> Check:
    v = Verdicts(f"{spec.alias}.model_path")
    if not spec.path:
        return v.fail("model_path is not set", "set model_path")
    if exists(spec.path):
        return v.ok(spec.path)
    return v.fail(f"model_path {spec.path} does not exist", f"fix the path in {spec.source}")


def _weight_check(
    spec: ModelSpec, uf: Mapping[str, tuple[str, ...]], exists: Callable[[str], bool]
) -> Check:
    v = Verdicts(f"{spec.alias}.kt_weight_path")
    weight = spec.kt_weight_path
    weight_src = "kt_weight_path"
    if weight is None and uf.get("--kt-weight-path"):
        weight = uf["--kt-weight-path"][0]
        weight_src = "--kt-weight-path in extra_args"
    if weight is None:
        return v.warn(
            "kt_weight_path is not set: no --kt-weight-path, so kt-kernel is off and "
            "SGLang tries to hold every expert on the GPU",
            "set kt_weight_path to the converted (CPU) expert weights",
        )
    if exists(weight):
        return v.ok(f"{weight} ({weight_src})")
    return v.fail(
        f"{weight_src} {weight} does not exist",
        "convert the weights with kt-kernel's converter or fix the path",
    )


def _gpu_experts_check(spec: ModelSpec, uf: Mapping[str, tuple[str, ...]]) -> Check:
    v = Verdicts(f"{spec.alias}.gpu_experts")
    if not any(f in uf for f in GPU_EXPERT_FLAGS):
        return v.warn(
            "neither --kt-num-gpu-experts nor --kt-gpu-experts-ratio in extra_args: "
            "kt-kernel silently falls back to GPU-only and runs out of memory",
            "add e.g. '--kt-num-gpu-experts 0' (all experts on CPU) to extra_args",
        )
    given = ", ".join(f"{f} {' '.join(uf[f])}" for f in GPU_EXPERT_FLAGS if f in uf)
    return v.ok(given)


def _ctx_check(spec: ModelSpec) -> Check:
    v = Verdicts(f"{spec.alias}.ctx")
    if spec.ctx == 0:
        return v.ok("0: SGLang's default context length")
    if spec.ctx < 0:
        return v.fail(f"ctx {spec.ctx} is negative", "set ctx >= 0")
    if spec.ctx > MAX_SANE_CTX:
        return v.warn(
            f"ctx {spec.ctx} exceeds {MAX_SANE_CTX} tokens",
            "check the model's real context length; the KV cache may not fit",
        )
    return v.ok(str(spec.ctx))


def _port_check(spec: ModelSpec, port_free: Callable[[str, int], bool], running: bool) -> Check:
    v = Verdicts(f"{spec.alias}.port")
    if spec.port == 0:
        return v.ok("0: a free port is picked at launch")
    if running:
        return v.ok(f"{spec.host}:{spec.port} (engine running)")
    if port_free(spec.host, spec.port):
        return v.ok(f"{spec.host}:{spec.port} is free")
    return v.fail(
        f"{spec.host}:{spec.port} is in use",
        "SGLang only binds after loading, so it would fail minutes in: free the port or set port 0",
    )


def _method_check(
    spec: ModelSpec, uf: Mapping[str, tuple[str, ...]], topo: Topology
) -> list[Check]:
    values = uf.get("--kt-method", ())
    method = (values[0] if values else DEFAULT_KT_METHOD).upper()
    shown = f"--kt-method {method}" + ("" if values else " (default)")
    v = Verdicts(f"{spec.alias}.kt_method")
    if method in AMX_METHODS and topo.isa() != "amx":
        return [
            v.fail(
                f"{shown} needs AMX; this CPU has {topo.isa()}",
                "pass a non-AMX --kt-method (e.g. LLAMAFILE or RAWINT4) with matching weights",
            )
        ]
    return [v.ok(shown)]


def _placement_check(spec: ModelSpec, topo: Topology) -> list[Check]:
    p = plan(
        spec.alias,
        spec.numa,
        spec.gpus,
        spec.extra_args,
        topo,
        (),
        tp_size=spec.tp_size,
    )
    v = Verdicts(f"{spec.alias}.placement")
    if not p.ok:
        return [v.fail(p.reason or "cannot be placed", "fix numa/gpus in models.json")]
    detail = (
        f"NUMA {','.join(map(str, p.numa_nodes))}, {len(p.cpus)} CPUs, "
        f"GPUs {','.join(map(str, p.gpus)) or 'none'}; " + " ".join(p.argv_flags())
    )
    if p.notes:
        return [v.warn(detail, "; ".join(p.notes))]
    return [v.ok(detail)]


def argv_check(spec: ModelSpec, topo: Topology, catalog: SGLangOptions | None) -> list[Check]:
    """Which flags ktd will emit for this SGLang, and which it leaves out (and why)."""
    v = Verdicts(f"{spec.alias}.argv")
    try:
        p = plan(
            spec.alias,
            spec.numa,
            spec.gpus,
            planner_args(spec.extra_args, catalog),
            topo,
            (),
            tp_size=spec.tp_size,
        )
        launch = build_launch(spec, spec.port or 1, p.argv_flags() if p.ok else (), catalog)
    except LaunchError as exc:
        return [v.fail(str(exc), "fix extra_args (or the SGLang install)")]
    derived = launch.argv[3 : len(launch.argv) - len(spec.extra_args)]
    flags = " ".join(a for a in derived if a.startswith("--"))
    against = f"checked against {catalog.label}" if catalog else "SGLang's options unknown"
    detail = f"ktd emits {flags} ({against})"
    if launch.notes:
        detail += "; " + "; ".join(launch.notes)
    checks = [v.ok(detail)]
    sleep = Verdicts(f"{spec.alias}.sleep")
    if spec.sleep and launch.sleeps:
        checks.append(sleep.ok("sleeps instead of stopping"))
    elif spec.sleep:
        checks.append(
            sleep.warn(
                f"{catalog.label if catalog else 'its SGLang'} has no --enable-memory-saver: "
                "this model's swaps stop and reload",
                "install sglang-kt (or an SGLang with the memory saver) in its python",
            )
        )
    return checks


# ---------------------------------------------------------------- python / packages


def python_checks(probe: Mapping[str, Any]) -> list[Check]:
    """Verdicts on the engine interpreter probe
    (:meth:`ktd.daemon.engine.probe.ProbeResult.summary`).

    ``probe`` = ``{"python", "sglang", "sglang_package", "kt_fork", "kt_flags",
    "kt_kernel", "kt_variant", "options_error", "error"}``: ``sglang`` is the real
    version (package metadata: the fork's ``__version__`` says ``0.0.0.dev0``),
    ``sglang_package`` tells upstream ``sglang`` from the kt fork ``sglang-kt``,
    ``kt_flags`` lists the ``--kt-*`` flags its argparse declares (None when the
    option list could not be read). Unknown keys are ignored.
    """
    py = str(probe.get("python") or "python")
    error = probe.get("error")
    v = Verdicts("python")
    if error:
        return [
            v.fail(
                f"cannot probe {py}: {error}",
                "set ktransformers.python to the interpreter of SGLang's venv",
            )
        ]
    checks = [v.ok(py), _sglang_check(probe, py), _kt_kernel_check(probe, py)]
    flags = _kt_flags_check(probe, py)
    return checks + ([flags] if flags else [])


def _sglang_check(probe: Mapping[str, Any], py: str) -> Check:
    """SGLang importable, and the kt fork rather than upstream."""
    sglang = probe.get("sglang")
    package = probe.get("sglang_package") or "sglang"
    fork = probe.get("kt_fork")
    v = Verdicts("python.sglang")
    if not sglang:
        return v.fail(
            f"sglang is not importable by {py}",
            f"install the kt fork in that venv ({py} -m pip install sglang-kt; or set "
            "auto_build), or point ktransformers.python at the venv that has it",
        )
    if fork is False:
        return v.warn(
            f"{package} {sglang}: upstream SGLang, not the kt fork (no --kt-numa-nodes; its "
            "kt wrapper does not match kt-kernel 0.7's API)",
            f"{py} -m pip uninstall -y sglang && {py} -m pip install sglang-kt",
        )
    what = "the kt fork" if fork else "kt fork or upstream unknown"
    return v.ok(f"{package} {sglang} ({what})")


def _kt_kernel_check(probe: Mapping[str, Any], py: str) -> Check:
    kt = probe.get("kt_kernel")
    v = Verdicts("python.kt_kernel")
    if not kt:
        return v.fail(
            f"kt_kernel is not importable by {py}",
            "install kt-kernel in that venv (ktd never builds or installs it)",
        )
    variant = probe.get("kt_variant")
    return v.ok(f"kt-kernel {kt}" + (f" ({variant})" if variant else ""))


def _kt_flags_check(probe: Mapping[str, Any], py: str) -> Check | None:
    """The ``--kt-*`` flags SGLang's argparse declares (none said when it has no SGLang)."""
    sglang = probe.get("sglang")
    package = probe.get("sglang_package") or "sglang"
    kt_flags = probe.get("kt_flags")
    v = Verdicts("python.kt_flags")
    if isinstance(kt_flags, list) and kt_flags:
        return v.ok("declares " + " ".join(kt_flags))
    if isinstance(kt_flags, list):
        return v.fail(
            f"{package} {sglang} declares no --kt-* flags: kt-kernel cannot be used",
            f"{py} -m pip install sglang-kt",
        )
    if sglang:
        return v.warn(
            "could not read SGLang's option list: "
            + str(probe.get("options_error") or "unknown error"),
            "ktd builds the argv without checking it against SGLang; run "
            f"'{py} -m sglang.launch_server --help' to see what fails",
        )
    return None


# ---------------------------------------------------------------- report


#: The first kt-kernel whose TaskQueue worker waits on a condition variable when idle
#: (ktransformers #1899); before it, one thread per engine spins at 100% (#1858, #1898).
KT_IDLE_FIX = (0, 5, 3)


def kt_spins_idle(version: str | None) -> bool:
    """kt-kernel ``version`` (``0.5.2.post1``...) keeps a core busy while idle."""
    if not version:
        return False
    nums: list[int] = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        nums.append(int(digits))
    return len(nums) >= 2 and tuple(nums) < KT_IDLE_FIX


def kt_spin_note(version: str | None) -> str | None:
    """What a model that sleeps is told about an old kt-kernel (status, dry-run, doctor)."""
    if not kt_spins_idle(version):
        return None
    return (
        f"kt-kernel {version} keeps one thread spinning while idle (fixed in 0.5.3): an "
        "asleep engine takes a core from the awake engine on its NUMA node"
    )


def sleep_checks(specs: Iterable[ModelSpec], probe: Mapping[str, Any]) -> list[Check]:
    """A model that sleeps next to an old kt-kernel: its idle spin costs the node a core."""
    note = kt_spin_note(probe.get("kt_kernel"))
    if note is None:
        return []
    return [
        Verdicts(f"{s.alias}.sleep").warn(note, "upgrade kt-kernel to 0.5.3 or later")
        for s in specs
        if s.served and s.sleep
    ]


def collect(
    topo: Topology,
    specs: Iterable[ModelSpec] = (),
    probe: Mapping[str, Any] | None = None,
    *,
    port_free: Callable[[str, int], bool],
    exists: Callable[[str], bool] = os.path.exists,
    running: Iterable[str] = (),
    catalog: SGLangOptions | None = None,
) -> list[Check]:
    """Every check in display order; the caller supplies the probe and the I/O callables."""
    up = set(running)
    checks = [*cpu_checks(topo), *numa_checks(topo), *gpu_checks(topo)]
    specs = list(specs)
    if probe is not None:
        checks.extend(python_checks(probe))
        checks.extend(sleep_checks(specs, probe))
    for spec in specs:
        if not spec.served:
            continue
        checks.extend(
            model_checks(
                spec, port_free=port_free, exists=exists, topo=topo, running=spec.alias in up
            )
        )
        if probe is not None and not probe.get("error"):
            checks.extend(argv_check(spec, topo, catalog))
    return checks


def report(checks: Sequence[Check], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ktctl doctor --json`` document: checks, counts, exit code, plus ``extra``.

    ``extra`` (topology, config path, ...) cannot overwrite ``checks``,
    ``summary`` or ``exit_code``.
    """
    summary = {"ok": 0, "warn": 0, "fail": 0}
    for c in checks:
        summary[c.status] += 1
    out: dict[str, Any] = dict(extra)
    out["checks"] = [asdict(c) for c in checks]
    out["summary"] = summary
    out["exit_code"] = 1 if summary["fail"] else 0
    return out
