"""Carries out ``ktd.core.gpuexperts``: the out-of-memory retry of a derived
``--kt-num-gpu-experts`` and the count kept per model and host (issue 44 item 6).

The keeper is one of the pool's observers: it sees each engine reach ready (a retry's
count is then kept) and annotates ``ktctl status``. The supervisor asks it, through the
engine (``Engine.launch_spec``, ``Engine.exit_outcome``), for the spec a launch runs and
what an exit before ready means. What is kept lives in ``<state_dir>/gpu-experts.json``
under this host's name, so a restarted daemon (or one on a shared state directory of
another host) launches with what worked here.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ktd.core import gpuexperts as G
from ktd.core import states as S
from ktd.core.config import ModelSpec
from ktd.core.exits import Outcome
from ktd.core.verdict import Check
from ktd.protocol import EngineInfo


class ExpertsEngine(Protocol):
    """What the keeper reads of an engine (``ktd.daemon.engine.engine.Engine`` has it; the
    record asks the keeper, so the keeper names only this)."""

    @property
    def alias(self) -> str: ...
    @property
    def spec(self) -> ModelSpec: ...
    @property
    def state(self) -> S.State: ...


log = logging.getLogger("ktd.gpuexperts")

__all__ = ["FILE", "ExpertsKeeper", "keeper_of"]

FILE = "gpu-experts.json"


def keeper_of(host: object) -> ExpertsKeeper | None:
    """The pool's keeper (one of its observers), or None (an engine tested alone)."""
    for observer in getattr(host, "observers", ()):
        if isinstance(observer, ExpertsKeeper):
            return observer
    return None


def _derived(spec: ModelSpec) -> int | None:
    return G.derived_count(spec.catalog, spec.extra_args)


class ExpertsKeeper:
    def __init__(self, path: Path, host: str | None = None) -> None:
        self.path = path
        self.host = host or socket.gethostname()
        self.machine = G.ExpertsMachine()
        self._doc: dict[str, Any] = self._read()
        for alias, row in self._mine().items():
            try:
                self.machine.restore(alias, int(row["derived"]), int(row["kept"]))
            except (KeyError, TypeError, ValueError):
                log.warning("%s: %s@%s is no kept count: %r", path, alias, self.host, row)

    # ------------------------------------------------------------ the supervisor's asks

    def spec(self, engine: ExpertsEngine) -> ModelSpec:
        """The spec this launch runs: the derived count replaced by a retry's or the
        kept one."""
        spec = engine.spec
        derived = _derived(spec)
        count = self.machine.launch(engine.alias, derived)
        if count is None or count == derived:
            return spec
        return msgspec.structs.replace(spec, extra_args=G.with_count(spec.extra_args, count))

    def outcome(self, engine: ExpertsEngine, out: Outcome, tail: list[str]) -> Outcome:
        """An exit before ready: out of GPU memory with a derived count is retried once
        with fewer (``fewer_experts``, which the lifecycle launches again at once)."""
        if out.kind != "failed":
            return out
        decision = self.machine.failed(engine.alias, _derived(engine.spec), G.out_of_memory(tail))
        if isinstance(decision, G.Retry):
            log.warning("%s: %s", engine.alias, decision.reason())
            return Outcome("fewer_experts", decision.reason())
        return out

    # ------------------------------------------------------------ a pool observer

    def engine_changed(self, engine: ExpertsEngine) -> None:
        if engine.state == S.READY:
            kept = self.machine.ready(engine.alias, _derived(engine.spec))
            if kept is not None:
                log.info(
                    "%s: %s %d loads on %s (derived %d): kept",
                    engine.alias, G.FLAG, kept.count, self.host, kept.derived,
                )  # fmt: skip
                self._keep(engine.alias, kept)
        elif engine.state in (S.STOPPED, S.FAILED):
            self.machine.ended(engine.alias)

    async def before_drain(self, engine: ExpertsEngine) -> bool:
        return True

    @property
    def routes_engines(self) -> bool:
        return False

    def annotate(self, info: EngineInfo) -> None:
        """``ktctl status``: the count kept for it on this host (or a retry's)."""
        row = self._mine().get(info.alias)
        trying = self.machine.trying(info.alias)
        if trying is not None:
            info.gpu_experts = trying
        elif row is not None and isinstance(row.get("kept"), int):
            info.gpu_experts = row["kept"]

    # ------------------------------------------------------------ doctor

    def report(self, specs: dict[str, ModelSpec]) -> list[dict[str, Any]]:
        """Every model with a derived count: derived, kept here (or None), in use."""
        out = []
        for alias, spec in sorted(specs.items()):
            derived = _derived(spec)
            if derived is None:
                continue
            kept = self.machine.kept(alias, derived)
            out.append(
                {
                    "alias": alias,
                    "host": self.host,
                    "catalog": spec.catalog,
                    "derived": derived,
                    "kept": kept,
                    "launches_with": derived if kept is None else kept,
                }
            )
        return out

    def checks(self, specs: dict[str, ModelSpec]) -> list[Check]:
        """``ktctl doctor``: a line per model with a derived count, what it launches with."""
        out = []
        for row in self.report(specs):
            detail = f"{G.FLAG} {row['derived']} derived from the catalog ({row['catalog']})"
            if row["kept"] is not None:
                detail += (
                    f"; {row['kept']} kept on {row['host']} after an out-of-memory load "
                    f"(launches with {row['kept']})"
                )
            out.append(Check(f"gpu experts {row['alias']}", "ok", detail))
        return out

    # ------------------------------------------------------------ the state file

    def _read(self) -> dict[str, Any]:
        try:
            doc = msgspec.json.decode(self.path.read_bytes())
        except FileNotFoundError:
            return {"hosts": {}}
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("%s not read (%s): no kept GPU-experts counts", self.path, exc)
            return {"hosts": {}}
        if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
            return {"hosts": {}}
        return doc

    def _mine(self) -> dict[str, Any]:
        mine = self._doc["hosts"].get(self.host)
        return mine if isinstance(mine, dict) else {}

    def _keep(self, alias: str, kept: G.Kept) -> None:
        hosts = self._doc["hosts"]
        mine = hosts[self.host] = self._mine()
        mine[alias] = {"derived": kept.derived, "kept": kept.count, "at": round(time.time(), 3)}
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(msgspec.json.encode(self._doc))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)
