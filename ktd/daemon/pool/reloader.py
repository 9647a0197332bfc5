"""Hot reload, carried out: only what changed restarts, and only when idle.

llama-swap's habit of restarting every model on a config change is what users
dislike most about its reload. Here the plan is pure (``ktd.core.reload``):
engines whose launch is unchanged keep running untouched (their lifecycle fields
update in place); changed ones restart when idle, or are flagged ``stale`` until
their last request ends; removed ones drain and stop; new ones appear stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ktd.core import states as S
from ktd.core.config import ModelSpec
from ktd.core.reload import plan_reload
from ktd.daemon.engine.engine import Engine

StartSoon = Callable[..., Any]  # the pool's nursery.start_soon (a no-op before it runs)


class Reloader:
    """Carries out a reload plan on the pool's engines; built by the pool with what it
    needs (no pool behind it): the engines, how to add one, how to start a task, how
    to recall an engine's claims, and how to forget the launch probes."""

    def __init__(
        self,
        engines: dict[str, Engine],
        *,
        add_engine: Callable[[ModelSpec], None],
        start_soon: StartSoon,
        recall_idle: Callable[[Engine, str], object],
        forget_probes: Callable[[], None],
    ) -> None:
        self.engines = engines
        self._add_engine = add_engine
        self._start_soon = start_soon
        self._recall_idle = recall_idle
        self._forget_probes = forget_probes

    def apply(self, served: dict[str, ModelSpec]) -> str:
        """Take the engines to the new config's served models; the reload's summary."""
        self._forget_probes()  # a venv may have been upgraded: the next launch probes again
        views = {alias: e.existing() for alias, e in self.engines.items()}
        plan = plan_reload(views, served)
        for change in plan.changes:
            self._apply(change.alias, change.kind, change.spec, change.schedule_restart)
        return plan.summary()

    def _apply(self, alias: str, kind: str, spec: ModelSpec | None, schedule_restart: bool) -> None:
        """Carry out one change of a reload plan."""
        engine = self.engines.get(alias)
        if kind == "remove" and engine is not None:
            engine.retired = True
            engine.request_down()
            self._start_soon(self.forget_when_stopped, engine)
            return
        assert spec is not None
        if kind == "revive" and engine is not None:
            # The same supervisor serves it again, with the new spec next start.
            engine.retired = False
            engine.spec = spec
            engine.pending_spec = None
            engine.notify_changed()
        elif kind in ("add", "replace"):
            self._add_engine(spec)
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
                self._start_soon(self.restart_when_idle, engine)

    async def forget_when_stopped(self, engine: Engine) -> None:
        await engine.wait_stopped()
        await engine.wait_until(lambda: engine.finished or not engine.retired)
        if engine.retired and self.engines.get(engine.alias) is engine:
            del self.engines[engine.alias]

    async def restart_when_idle(self, engine: Engine) -> None:
        """Restart ``engine`` with its pending spec once nothing holds it (also for an
        adopted engine whose launch changed while no ktd watched)."""
        # An engine being adopted: let its supervisor take it over first (it then wants up).
        await engine.wait_until(lambda: engine.adopt is None)
        # Claim holders keep routing until their first idle moment, then give it back.
        self._recall_idle(engine, "restart after reload")
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
