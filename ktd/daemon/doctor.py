"""Doctor in the daemon: the dry-run plan of a load, and the report with the pool's engines.

Doctor runs in the daemon when there is one (it sees the machine and the
environment the engines will get), locally otherwise: the checks themselves are
``ktd.checkup``'s, which ktctl runs in its own process when the daemon is down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ktd.checkup import build_report, one_line
from ktd.core import doctor
from ktd.core.command import (
    LaunchError,
    env_additions,
    keyed_launch,
    with_key_file,
)
from ktd.core.config import Config
from ktd.daemon.engine import gpuexperts, weights
from ktd.daemon.engine.probe import ProbeResult

if TYPE_CHECKING:
    from ktd.daemon.pool.pool import Pool
    from ktd.gateway.sync import GatewaySync


def _no_sglang(python: str, probe: ProbeResult | None) -> str | None:
    """What a dry-run says of an interpreter without SGLang (issue 43: it said "(None)"
    in a note and ``sglang: null``): a load would fail, and what to do."""
    if probe is None or probe.sglang is not None:
        return None
    why = probe.sglang_error or probe.error
    return (
        f"no SGLang in {python}"
        + (f" ({one_line(why)})" if why else "")
        + ": a load would fail; install sglang-kt in that Python, or set kt.python to one "
        "that has it"
    )


def dry_run_plan(pool: Pool, alias: str, probe: ProbeResult | None = None) -> dict[str, Any]:
    """What ``ktctl load --dry-run`` shows: nothing is launched, nothing is changed.

    With ``probe`` the plan is the one a launch would make: user flags read as
    the installed SGLang reads them, derived flags it does not declare left out
    (listed in ``notes``), and a flag it would refuse reported as ``error``.
    """
    engine = pool.engine(alias)
    spec = engine.launch_spec()  # a derived GPU-experts count as the next launch has it
    catalog = probe.catalog if probe else None
    sglang = probe.sglang_label if probe and probe.sglang else None
    missing_note = _no_sglang(spec.python, probe)
    try:
        plan = pool.plan(spec, exclude=engine, catalog=catalog)
        launch, keyed = keyed_launch(spec, spec.port, plan.argv_flags(), catalog)
    except LaunchError as exc:
        return {"alias": alias, "ok": False, "reason": str(exc), "error": str(exc),
                "sglang": sglang, "state": engine.state,
                **({"sglang_error": missing_note} if missing_note else {})}  # fmt: skip
    argv = launch.argv
    if not spec.port:
        argv[argv.index("--port") + 1] = "<auto>"
    if keyed.config:  # the engine's key file, written at launch (issue 32)
        argv = with_key_file(argv, str(pool.key_dir.file_for(alias)))
    out: dict[str, Any] = plan.to_dict()
    spin = doctor.kt_spin_note(probe.kt_kernel) if probe and spec.sleep else None
    extra = [n for n in (keyed.note, spin) if n]
    out["notes"] = [*out["notes"], *launch.notes, *extra]
    if catalog is None and missing_note is None:
        why = (probe.options_error or probe.error) if probe else None
        out["notes"].append(
            "SGLang's options could not be read"
            + (f" ({why})" if why else "")
            + ": argv not checked against them"
        )
    if missing_note:
        out["sglang_error"] = missing_note
    out.update(
        argv=argv,
        env=env_additions(spec, plan.env, sleeps=launch.sleeps),
        state=engine.state,
        running_pid=engine.run.pid if engine.run else None,
        python=spec.python,
        sglang=sglang,
    )
    return out


async def daemon_report(
    config: Config, pool: Pool, gateway: GatewaySync | None = None
) -> dict[str, Any]:
    import trio

    extra = await gateway.doctor_checks() if gateway is not None else []
    keeper = gpuexperts.keeper_of(pool)
    extra += keeper.checks(config.models) if keeper is not None else []
    topo = await trio.to_thread.run_sync(weights.read_machine)  # the one the pool places on
    pool.refresh_topology(topo)
    running = {e.alias: e.run.port for e in pool.engines.values() if e.run is not None}
    return await trio.to_thread.run_sync(
        lambda: build_report(config, topo, running=running, where="daemon", extra_checks=extra)
    )
