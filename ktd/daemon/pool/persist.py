"""The state file and adoption: what a restarted daemon learns of the engines it left.

Ownership is the engine marker in each process's environment
(``ktd.daemon.pool.adoption``), never the state file alone; the file adds how each
engine was placed, its state, and the claims the frontends held on it, so that a
``kill -9`` of ktd with streams running loses neither an engine nor a claim.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from ktd.core import states as S
from ktd.core.claimsync import ClaimRec, FrontendProcess, Restored
from ktd.core.command import ENGINE_MARK, SAVER
from ktd.daemon.engine import proctree
from ktd.daemon.engine.engine import Engine, Running
from ktd.daemon.engine.key import KeyDir, admin_key_of_argv, key_of_argv
from ktd.daemon.pool import adoption, statefile

#: Gives an adopted engine back the claims its frontends held: (claim id, client, the
#: frontend's process when known).
RestoreClaims = Callable[[Engine, Iterable[Restored]], None]

log = logging.getLogger("ktd")


class FixedPlacement:
    """The placement an adopted engine was started with (from the state file)."""

    def __init__(
        self,
        *,
        numa_nodes: tuple[int, ...],
        cpus: tuple[int, ...],
        gpus: tuple[int, ...],
        env: dict[str, str],
    ) -> None:
        self.numa_nodes = numa_nodes
        self.cpus = cpus
        self.gpus = gpus
        self.env = env

    def argv_flags(self) -> list[str]:
        return []

    def to_dict(self) -> dict[str, Any]:
        return {
            "numa_nodes": list(self.numa_nodes),
            "cpus": list(self.cpus),
            "gpus": list(self.gpus),
            "env": self.env,
            "adopted": True,
        }


def snapshot(engines: list[Engine]) -> statefile.StateFile:
    records = []
    for e in engines:
        run = e.run
        if run is None or e.state not in S.HAS_PROCESSES:
            continue
        plan = e.plan
        records.append(
            statefile.EngineRecord(
                alias=e.alias,
                pid=run.pid,
                start=run.start,
                engine_id=run.engine_id,
                port=run.port,
                argv=run.argv,
                numa_nodes=list(plan.numa_nodes) if plan else [],
                cpus=list(plan.cpus) if plan else [],
                gpus=list(plan.gpus) if plan else [],
                env=dict(plan.env) if plan else {},
                since=e.since,
                state=e.state,
                step=e.phase.step if e.phase else None,
                backed_up=e.backed_up,
                started_at=run.started_at,
                digest=run.digest,
                claims=[_claim_record(c) for c in e.claims.values()],
            )
        )
    return statefile.StateFile(daemon_pid=os.getpid(), engines=records)


def _claim_record(c: ClaimRec) -> statefile.ClaimRecord:
    h = c.holder
    return statefile.ClaimRecord(
        id=c.id, client=c.client, pid=h.pid if h else 0, start=h.start if h else 0
    )


def _holder(c: statefile.ClaimRecord) -> FrontendProcess | None:
    return FrontendProcess(c.pid, c.start) if c.pid > 0 else None


class Persister:
    """The state file's contents and the adoption of what it names; built by the pool
    with what it needs (no pool behind it)."""

    def __init__(
        self,
        engines: dict[str, Engine],
        *,
        state_path: Path | None,
        instance: str,
        restore_claims: RestoreClaims,
        key_dir: KeyDir | None = None,
    ) -> None:
        self.engines = engines
        self.key_dir = key_dir
        self.state_path = state_path
        self.instance = instance
        self._restore_claims = restore_claims
        # Adopted engines whose launch changed while no ktd watched: restart when idle.
        self.restart_later: list[Engine] = []

    def snapshot(self) -> statefile.StateFile:
        return snapshot(list(self.engines.values()))

    def adopt(self) -> tuple[list[str], list[int]]:
        """Take over the engines a previous daemon left running; kill what cannot be
        adopted. Call before the pool runs. Returns (adopted aliases, killed pids)."""
        records: list[statefile.EngineRecord] = []
        if self.state_path is not None:
            loaded = statefile.load(self.state_path)
            if loaded.problem:
                log.error(
                    "%s; engines are recognised by their marker alone this time", loaded.problem
                )
            records = loaded.state.engines
        found = adoption.scan(self.instance)
        decision = adoption.decide(records, found, set(self.engines))
        for ignored, why in decision.ignored:
            log.warning(
                "state file names %s (pid %d) but %s: not adopted, not signalled",
                ignored.alias,
                ignored.pid,
                why,
            )
        adopted: list[str] = []
        for f, rec in decision.adopt:
            if self._adopt_one(self.engines[f.alias], f, rec):
                adopted.append(f.alias)
        killed: list[int] = []
        for f, why in decision.kill:
            pids = adoption.kill(f)
            if pids:
                log.warning("killed engine %s (pids %s): %s", f.engine_id, pids, why)
            killed += pids
        if self.key_dir is not None:
            # Key files no adopted engine names: their engines died while no ktd watched.
            keep = [e.adopt.key_file for e in self.engines.values() if e.adopt and e.adopt.key_file]
            for path in self.key_dir.sweep(keep):
                log.info("removed %s: no running engine reads it", path)
        return adopted, killed

    def _adopt_one(
        self, engine: Engine, f: adoption.Found, rec: statefile.EngineRecord | None
    ) -> bool:
        try:
            pidfd: int | None = os.pidfd_open(f.pid)
        except OSError:
            pidfd = None
        owned = proctree.owned_by_us(f.pid)
        if not (owned and proctree.environ_has(f.pid, ENGINE_MARK, f.engine_id)):
            # Gone (or replaced) since the scan: nothing to adopt, nothing to kill.
            if pidfd is not None:
                os.close(pidfd)
            return False
        known = _from_record(rec) if rec is not None else _from_process(f, engine)
        digest, state, step, started_at, port, argv, plan = known
        # Its key: from the 0600 file its argv names (never from the state file).
        key, key_file = key_of_argv(argv)
        if key_file is not None and key is None:
            log.warning("engine %s: key file %s is gone; ktd cannot reach it", f.alias, key_file)
        admin_key = admin_key_of_argv(argv)
        engine.log.redact(key)
        engine.log.redact(admin_key)
        engine.log.adopt_output(f.pid)
        engine.begin_adoption(
            Running(
                digest=digest,
                adopted_state=state,
                adopted_step=step,
                started_at=started_at,
                pid=f.pid,
                start=f.start,
                engine_id=f.engine_id,
                port=port,
                argv=argv,
                pidfd=pidfd,
                sleeps=SAVER in argv,
                api_key=key,
                admin_key=admin_key,
                key_file=key_file,
            )
        )
        engine.plan = plan
        engine.backed_up = rec is not None and (rec.backed_up or rec.state == S.ASLEEP)
        if rec is not None and rec.claims:
            self._restore_claims(engine, [(c.id, c.client, _holder(c)) for c in rec.claims])
        if digest != engine.spec.launch_digest():
            # The config changed while no ktd watched: restart it when idle, as a reload would.
            engine.pending_spec = engine.spec
            engine.stale = True
            self.restart_later.append(engine)
        return True


class _Known(NamedTuple):
    """What ktd knows of an engine it adopts: from its state record, or its process."""

    digest: str
    state: S.State | None
    step: str | None
    started_at: float
    port: int
    argv: list[str]
    plan: FixedPlacement


def _from_record(rec: statefile.EngineRecord) -> _Known:
    plan = FixedPlacement(
        numa_nodes=tuple(rec.numa_nodes),
        cpus=tuple(rec.cpus),
        gpus=tuple(rec.gpus),
        env=dict(rec.env),
    )
    return _Known(
        rec.digest,
        rec.state,
        rec.step,
        rec.started_at or rec.since,
        rec.port,
        list(rec.argv),
        plan,
    )


def _from_process(f: adoption.Found, engine: Engine) -> _Known:
    """No record (lost to a failed write, or corrupt): what the process itself says.

    Unknown state: it gets a fresh health_timeout to answer (a ready one does at once),
    rather than being judged by a deadline computed from a guess."""
    plan = FixedPlacement(
        numa_nodes=f.numa_nodes,
        cpus=f.cpus,
        gpus=f.gpus,
        env={} if f.gpus_env is None else {"CUDA_VISIBLE_DEVICES": f.gpus_env},
    )
    port = f.port or 0
    log.warning(
        "recovered engine %s (pid %d, port %d) without a state record", f.alias, f.pid, port
    )
    digest = f.digest or engine.spec.launch_digest()
    return _Known(digest, None, None, time.time(), port, list(f.argv), plan)
