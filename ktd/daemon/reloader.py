"""Hot reload, carried out: only what changed restarts, and only when idle.

llama-swap's habit of restarting every model on a config change is what users
dislike most about its reload. Here the plan is pure (``ktd.core.reload``):
engines whose launch is unchanged keep running untouched (their lifecycle fields
update in place); changed ones restart when idle, or are flagged ``stale`` until
their last request ends; removed ones drain and stop; new ones appear stopped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ktd.core import states as S
from ktd.core.config import Config, DaemonSection, ModelSpec
from ktd.core.reload import EngineView, plan_reload
from ktd.daemon.claimtable import ClaimTable
from ktd.daemon.engine import Engine
from ktd.daemon.probe import Prober


class Pool(Protocol):
    """What a reload needs of the pool (``ktd.daemon.pool.Pool``; no import of it)."""

    config: Config
    settings: DaemonSection
    engines: dict[str, Engine]

    @property
    def prober(self) -> Prober: ...
    @property
    def claims(self) -> ClaimTable: ...

    def add_engine(self, spec: ModelSpec) -> None: ...

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None: ...


def apply_config(pool: Pool, new: Config) -> str:
    pool.prober.forget()  # a venv may have been upgraded: the next launch probes again
    views = {
        alias: EngineView(
            spec=e.spec,
            state=e.state,
            leases=e.busy(),
            retired=e.retired,
            finished=e.finished,
            restart_pending=e.pending_spec is not None,
        )
        for alias, e in pool.engines.items()
    }
    plan = plan_reload(views, {s.alias: s for s in new.served()})
    for change in plan.changes:
        _apply_change(pool, change.alias, change.kind, change.spec, change.schedule_restart)
    pool.config = new
    pool.settings = new.daemon
    return plan.summary()


def _apply_change(
    pool: Pool, alias: str, kind: str, spec: ModelSpec | None, schedule_restart: bool
) -> None:
    """Carry out one change of a reload plan."""
    engine = pool.engines.get(alias)
    if kind == "remove" and engine is not None:
        engine.retired = True
        engine.request_down()
        pool.start_soon(forget_when_stopped, pool, engine)
        return
    assert spec is not None
    if kind == "revive" and engine is not None:
        # The same supervisor serves it again, with the new spec next start.
        engine.retired = False
        engine.spec = spec
        engine.pending_spec = None
        engine.notify_changed()
    elif kind in ("add", "replace"):
        pool.add_engine(spec)
    elif kind == "same" and engine is not None:
        engine.pending_spec = None  # back to what runs: no restart pending any more
        engine.stale = False
    elif kind == "update" and engine is not None:
        engine.spec = spec
        engine.pending_spec = None
        engine.stale = False
        engine.notify_changed()  # new limits: the gate looks again
    elif kind in ("restart", "stale") and engine is not None:
        engine.pending_spec = spec
        if kind == "stale":
            engine.stale = True
        if schedule_restart:
            pool.start_soon(restart_when_idle, pool, engine)


async def forget_when_stopped(pool: Pool, engine: Engine) -> None:
    await engine.wait_stopped()
    await engine.wait_until(lambda: engine.finished or not engine.retired)
    if engine.retired and pool.engines.get(engine.alias) is engine:
        del pool.engines[engine.alias]


async def restart_when_idle(pool: Pool, engine: Engine) -> None:
    # An engine being adopted: let its supervisor take it over first (it then wants up).
    await engine.wait_until(lambda: engine.adopt is None)
    # Claim holders keep routing until their first idle moment, then give it back.
    pool.claims.recall(engine, kind="idle", idle=0.0, reason="restart after reload")
    await engine.wait_until(lambda: not engine.holding())
    if engine.pending_spec is None:
        return  # a later reload went back to the running launch
    was_up = engine.want_up or engine.state == S.READY
    engine.restarting = was_up  # requests waiting for its load ride the restarted one
    try:
        engine.request_down(reason="restarting with the reloaded config")
        downs = engine.downs
        await engine.wait_stopped()
        # Re-read: a reload during the stop may have replaced the pending spec.
        engine.spec = engine.pending_spec or engine.spec
        engine.pending_spec = None
        engine.stale = False
        if was_up and engine.downs == downs:  # an evict meanwhile wins over the restart
            engine.request_up()
    finally:
        engine.restarting = False
        engine.notify_changed()  # the gate looks again: riders ride on, or the load ended
