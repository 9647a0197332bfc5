"""The daemon in-process, for tests: real ``Engine`` records and the real drivers
(``Gatekeeper``, ``ClaimTable``, ``Sweeper``) around a host as narrow as ``EngineHost``;
a test plays the supervisor (``move``) and the clients, on trio's virtual clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.config import DaemonSection
from ktd.daemon.engine.engine import Engine
from ktd.daemon.pool.claimtable import ClaimTable
from ktd.daemon.pool.gate import Gatekeeper
from ktd.daemon.pool.sweeper import Sweeper
from tests.fixtures.specs import kt_spec

T = TypeVar("T")


@dataclass
class Host:
    """The pool around the engines, as narrow as ``EngineHost``: the drivers are real."""

    log_dir: Path
    settings: DaemonSection = field(default_factory=DaemonSection)
    closing: bool = False
    keeping_engines: bool = False
    instance: str = "test"
    base_env: dict[str, str] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    gate: Any = None
    sweeper: Any = None

    prober: Any = None
    http: Any = None

    def state_changed(self, engine: Engine) -> None:
        self.events.append(f"{engine.alias}:{engine.state}")

    def engine_changed(self, engine: Engine) -> None:
        if self.gate is not None:
            self.gate.update(engine)
        if self.sweeper is not None:
            self.sweeper.wake()

    def log_lines(self, engine: Engine, lines: list[str]) -> None:
        pass

    def expected_load(self, alias: str) -> float | None:
        return None


@dataclass
class Daemon:
    host: Host
    claims: ClaimTable
    gate: Gatekeeper
    sweeper: Sweeper

    def engine(self, alias: str, **spec: Any) -> Engine:
        e = Engine(kt_spec(alias=alias, **spec), self.host)  # type: ignore[arg-type]
        self.host.engines[alias] = e
        return e


async def inline(fn: Callable[..., T], /, *args: Any) -> T:
    """The pool's blocking work run on the trio thread (``ktd.daemon.offload``): a worker
    thread would let the autojumping virtual clock run on while it works, and
    ``wait_all_tasks_blocked`` return before the work is done."""
    return fn(*args)


def move(e: Engine, state: S.State, *, want_up: bool | None = None) -> None:
    """What the supervisor does: the only place a state moves."""
    e.state = state
    if want_up is not None:
        e.want_up = want_up
    if state == S.READY:
        e.idle_since = trio.current_time()
    e.notify_changed()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Any]:
    def make(**settings: Any) -> Daemon:
        host = Host(log_dir=tmp_path, settings=DaemonSection(**settings))
        claims = ClaimTable(on_change=lambda e, persist: e.notify_changed())

        def expire(clients: frozenset[str]) -> None:
            gate.release_clients(clients)
            claims.expire(clients)

        def settle(e: Engine) -> None:  # the pool's: the error an ended load deserves
            raise ControlError(p.ErrorCode.LOAD_FAILED, str(e.reason))

        sweeper = Sweeper(
            host.engines,
            host.settings.lease_ttl,
            expire=expire,
            recall_idle=lambda e, ttl: claims.recall(e, kind="idle", idle=ttl, reason="ttl"),
        )
        gate = Gatekeeper(
            claims,
            heard=sweeper.heard,
            on_lease=lambda e: e.notify_changed(),
            settle=settle,
            known=lambda: sorted(host.engines),
        )
        host.gate, host.sweeper = gate, sweeper
        return Daemon(host, claims, gate, sweeper)

    yield make
