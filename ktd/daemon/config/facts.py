"""What a config plan gathers of the machine for each new or changed model: its SGLang's
verdict on the flags (the real argparse's options, through the probe), its paths, where
it would be placed and whether it would fit now; and which engines are in motion.

Split from the desk (``ktd.daemon.config.desk``, which carries a change out);
``ktd.core.configplan`` decides with what is gathered here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import trio

from ktd.core import fit
from ktd.core.command import LaunchError
from ktd.core.config import ModelSpec
from ktd.core.configplan import Moving, SpecFacts
from ktd.core.placement import Plan
from ktd.core.sglang_options import SGLangOptions
from ktd.core.topology import Topology
from ktd.daemon.engine import preflight
from ktd.daemon.engine.engine import Engine
from ktd.daemon.engine.probe import ProbeResult, missing_message


class PoolView(Protocol):
    """What the desk and its facts ask of the pool (the pool's own operations for
    others); here, where the facts are gathered, and the desk imports it."""

    engines: dict[str, Engine]

    @property
    def topology(self) -> Topology: ...

    def plan(
        self,
        spec: ModelSpec,
        *,
        exclude: Engine | None = None,
        catalog: SGLangOptions | None = None,
    ) -> Plan: ...

    async def fit(self, spec: ModelSpec, plan: Plan) -> tuple[fit.Estimate, fit.Fit]: ...

    async def probe(self, spec: ModelSpec) -> ProbeResult: ...


def moving(engines: Mapping[str, Engine]) -> list[Moving]:
    """Each engine's state and step: what a change may not throw away (``in_motion``)."""
    out = []
    for e in engines.values():
        phase = e.phase
        out.append(
            Moving(
                alias=e.alias,
                state=e.state,
                step=str(phase.step) if phase is not None else None,
                engines=phase.engines if phase is not None else (),
            )
        )
    return out


async def facts(pool: PoolView, specs: Sequence[ModelSpec]) -> dict[str, SpecFacts]:
    """``facts_of`` each model, all at once (each probe may take seconds)."""
    out: dict[str, SpecFacts] = {}

    async def one(spec: ModelSpec) -> None:
        out[spec.alias] = await facts_of(pool, spec)

    async with trio.open_nursery() as nursery:
        for spec in specs:
            nursery.start_soon(one, spec)
    return out


async def facts_of(pool: PoolView, spec: ModelSpec) -> SpecFacts:
    """Its SGLang's verdict on the flags (the real argparse's options, through the
    probe), its paths, and where and whether it would fit now."""
    missing: list[tuple[str, str]] = []
    probe = await pool.probe(spec)
    catalog = probe.catalog
    refused = preflight.check_flags(spec, catalog)
    unchecked = None
    if not probe.ok_python:
        missing.append(("python", f"cannot run the engine's Python: {probe.error}"))
    elif catalog is None:
        why = missing_message(probe, auto_build=spec.auto_build) or probe.options_error
        unchecked = f"{spec.alias}: SGLang's options could not be read ({why}): flags not checked"
    paths = await trio.to_thread.run_sync(preflight.gather, spec)
    if not paths.model_path.exists:
        missing.append(("path", f"model_path {spec.path} does not exist"))
    elif not paths.model_path.readable:
        missing.append(("path", f"model_path {spec.path} is not readable by ktd's user"))
    elif paths.config_error:
        missing.append(("path", paths.config_error))
    if paths.kt_weight_path is not None and not paths.kt_weight_path.exists:
        missing.append(("kt_weight_path", f"kt_weight_path {spec.kt_weight_path} does not exist"))
    engine = pool.engines.get(spec.alias)
    try:
        plan = pool.plan(spec, exclude=engine, catalog=catalog)
    except LaunchError:
        plan = None  # the flags: already in ``refused``
    evicts: tuple[str, ...] = ()
    waits: tuple[str, ...] = ()
    fit_reason = None
    if plan is not None and plan.ok:
        evicts = tuple(plan.evict)
        if spec.fit == "check" and not missing:
            _, verdict = await pool.fit(spec, plan)
            fit_reason = verdict.reason
    elif plan is not None:
        waits = tuple(plan.blocked_by)
    return SpecFacts(
        refused_flags=refused,
        unchecked=unchecked,
        missing=tuple(missing),
        fit=fit_reason,
        evicts=evicts,
        waits_for=waits,
    )
