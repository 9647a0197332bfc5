"""The engine command line and environment (pure).

Exactly the seed's argv form, as a list, never through a shell:
``<python> -m sglang.launch_server --host H --port P --model M --kt-weight-path W
--served-model-name A --context-length C [placement flags] [extra_args]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ktd.config import ModelSpec

# Set on every engine so the daemon can recognise its own processes (and a
# re-started daemon its predecessor's) from /proc/<pid>/environ.
ENGINE_MARK = "KTD_ENGINE"
# The spec's launch digest, beside the marker: a ktd that lost the state file can
# still tell whether a recovered engine runs the configured launch.
DIGEST_MARK = "KTD_ENGINE_DIGEST"


def user_flag_names(extra_args: Sequence[str]) -> set[str]:
    """Flags the user wrote in extra_args, ``--flag value`` and ``--flag=value`` alike."""
    return {a.split("=", 1)[0] for a in extra_args if a.startswith("--")}


def build_argv(
    spec: ModelSpec,
    port: int,
    placement_flags: Sequence[str] = (),
) -> list[str]:
    """``placement_flags`` are the plan's derived flags; ones the user set are already dropped."""
    argv = [spec.python, "-m", "sglang.launch_server", "--host", spec.host, "--port", str(port)]
    argv += ["--model", spec.path]
    if spec.kt_weight_path:
        argv += ["--kt-weight-path", spec.kt_weight_path]
    argv += ["--served-model-name", spec.alias]
    if spec.ctx:
        argv += ["--context-length", str(spec.ctx)]
    user = user_flag_names(spec.extra_args)
    for flag, value in (
        ("--tp-size", spec.tp_size),
        ("--nnodes", spec.nnodes),
        ("--dist-init-addr", spec.dist_init_addr),
    ):
        if value is not None and flag not in user:
            argv += [flag, str(value)]
    argv += list(placement_flags)
    argv += list(spec.extra_args)
    return argv


def build_env(
    spec: ModelSpec,
    base: Mapping[str, str],
    placement_env: Mapping[str, str] | None = None,
    *,
    engine_id: str = "",
    digest: str = "",
) -> dict[str, str]:
    """ktd's environment, then the plan's (CUDA_VISIBLE_DEVICES), then the user's extra_env.

    The user's values win over the plan's: an operator who pins
    CUDA_VISIBLE_DEVICES by hand means it.
    """
    env = dict(base)
    env.pop("KTD_SOCKET", None)
    env.update(placement_env or {})
    env.update(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[ENGINE_MARK] = engine_id or spec.alias
    if digest:
        env[DIGEST_MARK] = digest
    return env


def env_additions(spec: ModelSpec, placement_env: Mapping[str, str]) -> dict[str, str]:
    """What ktd adds over its own environment: the dry-run plan shows exactly this."""
    env = dict(placement_env)
    env.update(spec.env)
    return env
