"""Doctor's checks of the machine and a config, run in the calling process.

The daemon runs them with what it knows of its engines (``ktd.daemon.doctor``);
``ktctl doctor`` runs them here when the daemon is down (it may be why). Kept
outside ``ktd/daemon/`` (issue 45) so ktctl reaches them without importing the daemon:
the probe is ``ktd.pyprobe``, the port check ``ktd.ports``, the verdicts ``ktd.core.doctor``.
"""

from __future__ import annotations

import os
from typing import Any

from ktd.core import doctor
from ktd.core.config import Config
from ktd.core.configload import load_config
from ktd.core.topology import Topology
from ktd.core.verdict import Check
from ktd.ports import port_free
from ktd.pyprobe import probe_python
from ktd.topology import read_topology


def one_line(text: str) -> str:
    """The last line of an error (a traceback's is what it says), cut to 200 characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:200]


def build_report(
    config: Config,
    topo: Topology,
    *,
    running: dict[str, int] | None = None,
    where: str,
    extra_checks: list[Check] | None = None,
) -> dict[str, Any]:
    served = config.served()
    probe = probe_python(served[0]) if served else None
    summary = probe.summary() if probe else None
    running = running or {}

    checks = doctor.collect(
        topo,
        served,
        summary,
        port_free=port_free,
        running=running.keys(),
        catalog=probe.catalog if probe else None,
    )
    checks += extra_checks or []
    return doctor.report(
        checks,
        {"where": where, "config": config.path, "topology": topo.to_dict(), "probe": summary or {}},
    )


def local_report(config_path: str | None = None) -> dict[str, Any]:
    """``ktctl doctor`` with no daemon: the same checks, run in this process."""
    from ktd import paths

    path = config_path or str(paths.default_config_path())
    where = "local (ktd is not running)"
    if not os.path.exists(path):
        # No config yet is the first-day state: the machine checks matter most then.
        topo = read_topology()
        checks = doctor.collect(topo, (), None, port_free=port_free)
        checks.append(
            Check(
                "config",
                "warn",
                f"no config at {path}: only the machine was checked",
                "`ktd init` writes a starter config; `ktd up --demo` runs the simulated engine",
            )
        )
        return doctor.report(checks, {"where": where, "config": None, "topology": topo.to_dict()})
    config = load_config(path)
    extra: list[Check] = []
    if config.gateway.routers:
        from ktd.gateway import doctor as gw_doctor

        extra = gw_doctor.checks(
            config.gateway, gw_doctor.probe_sync(config.gateway), instance=None
        )
    return build_report(config, read_topology(), where=where, extra_checks=extra)
