"""What the gateway sync reads of the daemon's pool and engines, as Protocols.

The gateway sits beside the daemon, not above it: ``ktd.daemon`` passes its pool
in, and these Protocols say what the sync may touch (read-only views, plus the
engine's phase it sets while deregistering). So ``ktd.gateway`` never imports
``ktd.daemon``, and its tests need only small fakes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ktd.core.config import DaemonSection
from ktd.core.states import Phase

__all__ = ["EngineLike", "PoolLike"]


class _Run(Protocol):
    @property
    def port(self) -> int: ...
    @property
    def adopted_state(self) -> str | None: ...


class _Spec(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def extra_args(self) -> Sequence[str]: ...


class _Placement(Protocol):
    @property
    def numa_nodes(self) -> Sequence[int]: ...
    @property
    def gpus(self) -> Sequence[int]: ...


class EngineLike(Protocol):
    """One engine of the pool (``ktd.daemon.engine.engine.Engine``)."""

    @property
    def alias(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def spec(self) -> _Spec: ...
    @property
    def run(self) -> _Run | None: ...
    @property
    def adopt(self) -> _Run | None: ...
    @property
    def plan(self) -> _Placement | None: ...
    @property
    def force(self) -> bool: ...
    @property
    def drain_timeout(self) -> float | None: ...
    @property
    def url(self) -> str | None: ...  # where the running engine answers
    @property
    def api_key(self) -> str | None: ...  # its run's key: the router must send it

    def notify_changed(self) -> None: ...

    def set_phase(self, phase: Phase) -> None: ...  # the sync's step while it deregisters


class PoolLike(Protocol):
    """The daemon's engine pool (``ktd.daemon.pool.pool.Pool``)."""

    @property
    def engines(self) -> Mapping[str, EngineLike]: ...
    @property
    def settings(self) -> DaemonSection: ...
