"""The reload diff (pure): what a new config means for each running engine.

Hot reload without llama-swap's habit of restarting everything: engines whose
launch is unchanged keep running (their lifecycle fields update in place);
changed ones restart when idle, or are ``stale`` until their last request ends;
removed ones drain and stop; new ones appear stopped. ``plan_reload`` decides;
the pool carries the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ktd.core import states as S
from ktd.core.config import ModelSpec

__all__ = ["Change", "Existing", "ReloadPlan", "plan_reload"]

ChangeKind = Literal[
    "remove",  # gone from the config: drain, stop, forget
    "revive",  # removed by an earlier reload, back before it stopped: serve it again
    "replace",  # removed earlier and gone: a fresh engine takes its place
    "add",  # new: appears stopped
    "same",  # the spec is what runs: clear any pending restart
    "update",  # the launch is unchanged (or nothing runs): new spec in place
    "restart",  # the launch changed and nothing in flight: restart when idle
    "stale",  # the launch changed and requests are in flight: stale until idle, then restart
]


@dataclass(frozen=True)
class Existing:
    """What the diff reads of an engine the pool has."""

    spec: ModelSpec
    state: str
    in_flight: int = 0
    retired: bool = False
    finished: bool = False  # its owner task has returned
    restart_pending: bool = False  # a changed spec already waits for it to go idle


@dataclass(frozen=True)
class Change:
    alias: str
    kind: ChangeKind
    spec: ModelSpec | None = None  # the new spec (None for "remove")
    schedule_restart: bool = False  # start a restart-when-idle task (none pending yet)


@dataclass
class ReloadPlan:
    changes: list[Change] = field(default_factory=list)

    def aliases(self, *kinds: ChangeKind) -> list[str]:
        return [c.alias for c in self.changes if c.kind in kinds]

    def summary(self) -> str:
        """``added: a; removed: b; ...`` or ``no changes``: the reload's reply."""
        parts = [
            f"{name}: {', '.join(items)}"
            for name, items in (
                ("added", self.aliases("add", "revive", "replace")),
                ("removed", self.aliases("remove")),
                ("restarting", self.aliases("restart")),
                ("stale until idle", self.aliases("stale")),
                ("updated in place", self.aliases("update")),
            )
            if items
        ]
        return "; ".join(parts) or "no changes"


def plan_reload(engines: Mapping[str, Existing], served: Mapping[str, ModelSpec]) -> ReloadPlan:
    """The changes that take ``engines`` to the served entries of the new config."""
    plan = ReloadPlan()
    for alias in engines:
        if alias not in served:
            plan.changes.append(Change(alias, "remove"))
    for alias, spec in served.items():
        view = engines.get(alias)
        if view is None:
            plan.changes.append(Change(alias, "add", spec))
        elif view.retired:
            kind: ChangeKind = "replace" if view.finished else "revive"
            plan.changes.append(Change(alias, kind, spec))
        elif spec == view.spec:
            plan.changes.append(Change(alias, "same", spec))
        elif spec.launch_key() == view.spec.launch_key() or view.state not in S.HAS_PROCESSES:
            plan.changes.append(Change(alias, "update", spec))
        else:
            kind = "stale" if view.in_flight else "restart"
            plan.changes.append(
                Change(alias, kind, spec, schedule_restart=not view.restart_pending)
            )
    return plan
