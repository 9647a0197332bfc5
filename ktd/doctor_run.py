"""The I/O around ``ktd.doctor`` and ``ktd.placement``: probing, dry-run plans, reports.

Doctor runs in the daemon when there is one (it sees the machine and the
environment the engines will get), locally otherwise.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

from ktd import doctor, proctree
from ktd.command import build_argv, build_env, env_additions
from ktd.config import Config, ModelSpec, load_config
from ktd.probe import PROBE_CODE, parse_probe_output
from ktd.topology import Topology, read_topology

if TYPE_CHECKING:
    from ktd.pool import Pool


def dry_run_plan(pool: Pool, alias: str) -> dict[str, Any]:
    """What ``ktctl load --dry-run`` shows: nothing is launched, nothing is changed."""
    engine = pool.engine(alias)
    spec = engine.spec
    plan = pool.make_plan(spec, exclude=engine)
    argv = build_argv(spec, spec.port, plan.argv_flags())
    if not spec.port:
        argv[argv.index("--port") + 1] = "<auto>"
    out: dict[str, Any] = plan.to_dict()
    out.update(
        argv=argv,
        env=env_additions(spec, plan.env),
        state=engine.state,
        running_pid=engine.run.pid if engine.run else None,
        python=spec.python,
    )
    return out


def probe_python(spec: ModelSpec, *, timeout: float = 120.0) -> dict[str, Any]:
    """Imports and versions in the engine's interpreter, plus whether SGLang knows --kt-*."""
    env = build_env(spec, os.environ)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [spec.python, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    try:
        r = run("-c", PROBE_CODE)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"python": spec.python, "error": str(exc)}
    res = parse_probe_output(spec.python, r.returncode, r.stdout + r.stderr)
    out: dict[str, Any] = {
        "python": spec.python,
        "sglang": res.sglang,
        "kt_kernel": res.kt_kernel,
        "kt_variant": res.kt_variant,
        "error": res.error,
    }
    if res.sglang:
        try:
            out["kt_flags"] = (
                "--kt-weight-path" in run("-m", "sglang.launch_server", "--help").stdout
            )
        except (OSError, subprocess.TimeoutExpired):
            out["kt_flags"] = None
    return out


def build_report(
    config: Config, topo: Topology, *, running: dict[str, int] | None = None, where: str
) -> dict[str, Any]:
    served = config.served()
    probe = probe_python(served[0]) if served else None
    running = running or {}

    def port_free(host: str, port: int) -> bool:
        return proctree.port_free(host, port)

    checks = doctor.collect(topo, served, probe, port_free=port_free, running=running.keys())
    return doctor.report(
        checks,
        {"where": where, "config": config.path, "topology": topo.to_dict(), "probe": probe or {}},
    )


async def daemon_report(config: Config, pool: Pool) -> dict[str, Any]:
    import trio

    topo = await trio.to_thread.run_sync(read_topology)
    pool.refresh_topology(topo)
    running = {e.alias: e.run.port for e in pool.engines.values() if e.run is not None}
    return await trio.to_thread.run_sync(
        lambda: build_report(config, topo, running=running, where="daemon")
    )


def local_report(config_path: str | None = None) -> dict[str, Any]:
    """``ktctl doctor`` with no daemon: the same checks, run in this process."""
    from ktd import paths

    path = config_path or str(paths.default_config_path())
    where = "local (ktd is not running)"
    if not os.path.exists(path):
        # No config yet is the first-day state: the machine checks matter most then.
        topo = read_topology()
        checks = doctor.collect(topo, (), None, port_free=proctree.port_free)
        checks.append(
            doctor.Check(
                "config",
                "warn",
                f"no config at {path}: only the machine was checked",
                "`ktd init` writes a starter config; `ktd up --demo` runs the simulated engine",
            )
        )
        return doctor.report(checks, {"where": where, "config": None, "topology": topo.to_dict()})
    config = load_config(path)
    return build_report(config, read_topology(), where=where)
