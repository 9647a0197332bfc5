"""The plan of a config change (pure): what applying it would do, and whether it may.

``ktctl config plan``/``apply`` and the dashboard's editor show this before anything
happens. Per engine: unchanged, updated live, restarted (and which fields made it),
added, removed, stopped, put to sleep to make room for a restart; the config.json
settings that change and when they take effect; and the problems, of which an
``error`` refuses the change: the config does not validate, a flag the engine's own
SGLang would refuse, a path that does not exist, a change that would throw away a
load or a swap under way. What each engine does is the reload's own diff
(``ktd.core.reload.plan_reload``: apply goes through the reload), read for people.

Everything here is a function of values: the running and the new config, the engines'
views, and the facts the daemon gathered about each new or changed model (its SGLang's
verdict on the flags, its paths, its memory fit and placement now:
``ktd.daemon.config.desk``).

The rule for a change while a load or a swap is under way (``in_motion``): refuse it,
naming the engine and what it is doing, when the change would restart, stop or put to
sleep an engine that is loading, waking or going to sleep, or one a swap waits for or
stops; any other change goes ahead. Not queued: a load takes minutes, a queued change
would hold every other writer that long, and the plan it was shown would be stale by
then; refused, the user applies again once the engine is ready (the base version makes
that safe), or evicts it first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ktd.core import modelfields, secret
from ktd.core import states as S
from ktd.core.config import Config, ConfigFile, ModelEntry, ModelSpec
from ktd.core.reload import Change, Existing, plan_reload
from ktd.protocol import (
    ConfigPlanView,
    ConfigProblem,
    EnginePlan,
    ErrorCode,
    FieldChange,
    SettingChange,
)

__all__ = [
    "Moving",
    "SpecFacts",
    "field_path",
    "in_motion",
    "plan_change",
    "refusals",
    "spec_changes",
]


@dataclass(frozen=True)
class SpecFacts:
    """What the daemon found out about one new or changed model (the I/O it did)."""

    refused_flags: str | None = None  # why its SGLang would refuse the command line
    unchecked: str | None = None  # why its flags could not be checked (no option list)
    missing: tuple[tuple[str, str], ...] = ()  # (spec field, why): paths, the interpreter
    fit: str | None = None  # why its memory estimate does not fit now
    evicts: tuple[str, ...] = ()  # engines its launch now would stop or put to sleep
    waits_for: tuple[str, ...] = ()  # busy engines its launch now would wait for


@dataclass(frozen=True)
class Moving:
    """What the rule reads of an engine: its state and its phase's step and engines."""

    alias: str
    state: str
    step: str | None = None
    engines: tuple[str, ...] = ()  # the phase's: the holders waited for, or being stopped


def in_motion(views: Sequence[Moving]) -> dict[str, str]:
    """alias -> what it is doing, for every engine a change must not disturb: loading
    (any step of ``starting``), waking, going to sleep, or waited for or being stopped
    by another engine's load (a swap)."""
    out: dict[str, str] = {}
    for v in views:
        if v.state == S.STARTING:
            out[v.alias] = f"loading ({v.step or 'starting'})"
        elif v.state == S.WAKING:
            out[v.alias] = "waking"
        elif v.state == S.SLEEPING:
            out[v.alias] = "going to sleep"
    for v in views:
        if v.state in (S.STARTING, S.WAKING) and v.step in (S.Step.WAITING, S.Step.MAKING_ROOM):
            for other in v.engines:
                out.setdefault(other, f"part of {v.alias}'s swap ({v.alias} is {v.step})")
    return out


#: Plan actions that take an engine's process away (and so a load or a swap with it).
DISTURBING = frozenset({"restart", "stop", "sleep"})


def refusals(engines: Sequence[EnginePlan], motion: Mapping[str, str]) -> list[ConfigProblem]:
    """The rule (module docstring): an error for each engine the change would restart,
    stop or put to sleep while it is in motion."""
    out = []
    for e in engines:
        doing = motion.get(e.alias)
        if doing is None or e.action not in DISTURBING:
            continue
        why = ", ".join(f.field for f in e.fields)
        out.append(
            ConfigProblem(
                level="error",
                alias=e.alias,
                code=ErrorCode.BUSY,
                message=(
                    f"{e.alias} is {doing}: this change would {e.action} it"
                    + (f" ({why})" if why else "")
                    + " and throw that away; apply it again once it is done "
                    f"(or `ktctl evict {e.alias}` first)"
                ),
            )
        )
    return out


# ---------------------------------------------------------------- which field says what


def _which_field() -> dict[str, tuple[str | None, str | None]]:
    """A model's resolved field -> (its models.json entry's field, the config.json default
    under it), in ModelSpec's order; None: that file has no such field. Read off the
    table of fields (``ktd.core.modelfields``), so a field added there is named here."""
    where: dict[str, tuple[str | None, str | None]] = {
        f.spec: (f.name, f.default or None) for f in modelfields.ENTRY
    }
    where.update((name, (None, setting)) for name, setting, _ in modelfields.SECTION_ONLY)
    return {name: where[name] for name in ModelSpec.__struct_fields__ if name in where}


_ENTRY_FIELDS = _which_field()
# The section's own model (ktransformers.model_path): its fields are the section's.
_SECTION_NAMES = {"path": "model_path", "alias": "model_id", "served": "enabled"}
_SHOWN = tuple(_ENTRY_FIELDS)


def _entry_of(config: Config, spec: ModelSpec) -> tuple[int, ModelEntry] | None:
    for i, entry in enumerate(config.entries):
        if entry.alias == spec.alias:
            return i, entry
    return None


def _sets(entry: ModelEntry, name: str) -> bool:
    """Does the entry itself set ``name`` (``kt.ctx``), or take the default under it?"""
    if name.startswith("kt."):
        return entry.kt is not None and getattr(entry.kt, name[3:]) is not None
    return getattr(entry, name, None) is not None


def field_path(
    config: Config, spec: ModelSpec, name: str, *, was: Config | None = None
) -> tuple[str, str, str]:
    """(file, JSON path, label) of the value behind ``spec``'s field ``name``: the entry's
    own when it sets it (or set it in ``was``: a value taken out of the entry is the
    entry's change), else the config.json default under it. ``label`` is how a plan
    names it (``kt.ctx``, ``ktransformers.ctx``)."""
    where = _entry_of(config, spec)
    models_file = spec.source.rpartition(": ")[0] or spec.source
    in_entry, in_section = _ENTRY_FIELDS.get(name, (name, None))
    if where is None:  # the ktransformers section's own model
        own = _SECTION_NAMES.get(name, name)
        return config.path, f"$.ktransformers.{own}", f"ktransformers.{own}"
    i, entry = where
    before = _entry_of(was, spec) if was is not None else None
    own_before = before is not None and in_entry is not None and _sets(before[1], in_entry)
    if in_entry is not None and (in_section is None or _sets(entry, in_entry) or own_before):
        return models_file, f"$[{i}].{in_entry}", in_entry
    label = in_section or name
    return config.path, "$." + label, label


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        if all(isinstance(v, tuple) and len(v) == 2 for v in value) and value:
            return {k: v for k, v in value}
        return [_json(v) for v in value]
    return value


def spec_changes(
    old: ModelSpec, new: ModelSpec, config: Config, was: Config | None = None
) -> list[FieldChange]:
    """The fields in which ``new`` differs from ``old``, named as ``config`` holds them
    (or ``was``, the config before, held them)."""
    out = []
    for name in _SHOWN:
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            label = field_path(config, new, name, was=was)[2]
            out.append(FieldChange(field=label, old=_json(before), new=_json(after)))
    return out


# ---------------------------------------------------------------- config.json's settings

#: daemon settings read once, when ktd starts (the rest apply at once).
_DAEMON_AT_START = frozenset({"runtime_dir", "state_dir", "log_dir", "group", "lease_ttl"})


def _secret_setting(section: str, key: str) -> bool:
    """A setting whose value is never shown (a plan travels to the dashboard): one whose
    field, or a field within it, is marked secret in the config's types."""
    hints: dict[str, Any] = secret.hints(secret.hints(ConfigFile)[section])
    return key in hints and secret.holds_secret(hints[key])


def _settings(old: Config, new: Config) -> list[SettingChange]:
    out = []
    for section in ("daemon", "frontend", "gateway"):
        before = msgspec.to_builtins(getattr(old.file, section))
        after = msgspec.to_builtins(getattr(new.file, section))
        for key in dict.fromkeys([*before, *after]):
            if before.get(key) == after.get(key):
                continue
            name = f"{section}.{key}"
            if section == "frontend":
                effect = "at the frontend's restart (ktd frontend reads it when it starts)"
            elif section == "daemon" and key in _DAEMON_AT_START:
                effect = "at ktd's restart"
            else:
                effect = "now"
            if _secret_setting(section, key):
                out.append(
                    SettingChange(field=name, old="(hidden)", new="(changed)", effect=effect)
                )
            else:
                out.append(
                    SettingChange(
                        field=name, old=before.get(key), new=after.get(key), effect=effect
                    )
                )
    if old.file.models_file != new.file.models_file:
        out.append(
            SettingChange(field="models_file", old=old.file.models_file, new=new.file.models_file)
        )
    return out


# ---------------------------------------------------------------- the plan


@dataclass
class _Plan:
    engines: dict[str, EnginePlan] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)


def _engine_plans(
    old: Config,
    new: Config,
    engines: Mapping[str, Existing],
) -> _Plan:
    served = {s.alias: s for s in new.served()}
    out = _Plan()
    for change in plan_reload(engines, served).changes:
        view = engines.get(change.alias)
        before = view.spec if view is not None else old.models.get(change.alias)
        spec = change.spec
        fields = (
            spec_changes(before, spec, new, old) if before is not None and spec is not None else []
        )
        out.engines[change.alias] = _change_plan(change, view, fields)
    _listed_plans(old, new, out.engines)
    return out


def _change_plan(change: Change, view: Existing | None, fields: list[FieldChange]) -> EnginePlan:
    """One change of the reload's diff as people read it: what happens to the engine, and
    when (a restart of a busy engine waits for its requests; an asleep one just stops)."""
    alias, kind = change.alias, change.kind
    state = str(view.state) if view is not None else ""
    running = view is not None and view.state in S.HAS_PROCESSES
    if kind == "same" or (kind == "update" and not fields):
        return EnginePlan(alias=alias, action="unchanged", state=state)
    if kind == "update":
        note = "applied now, nothing restarts" if running else "takes effect at its next load"
        return EnginePlan(alias=alias, action="update", state=state, fields=fields, note=note)
    if kind in ("restart", "stale"):
        assert view is not None
        if view.state == S.ASLEEP:
            action, note = "stop", "asleep: stopped now; its next request loads the new launch"
        elif kind == "stale":
            action = "restart"
            note = f"restarts when its {view.in_flight} request(s) in flight have ended"
        else:
            action, note = "restart", "stopped now (it is idle) and started with the new launch"
        return EnginePlan(alias=alias, action=action, state=state, fields=fields, note=note)
    if kind == "remove":
        if running:
            note = "removed from the config: drained and stopped"
            return EnginePlan(alias=alias, action="stop", state=state, note=note)
        return EnginePlan(alias=alias, action="remove", state=state, note="removed from the config")
    if kind == "revive":
        note = "was being removed: served again"
        return EnginePlan(alias=alias, action="start", state=state, fields=fields, note=note)
    # add, replace
    note = "new: stopped until a request or `ktctl load` starts it"
    return EnginePlan(alias=alias, action="add", state=state, note=note)


def _listed_plans(old: Config, new: Config, plans: dict[str, EnginePlan]) -> None:
    """Models ktd lists but does not serve (other backends, ktransformers.enabled false):
    no engine, so no reload change; added, changed or removed all the same."""
    for alias, spec in new.models.items():
        if not spec.served and alias not in plans:
            was = old.models.get(alias)
            if was is None:
                plans[alias] = EnginePlan(
                    alias=alias, action="add", note=f"listed, not served: {spec.not_served_reason}"
                )
            elif was.served == spec.served and spec_changes(was, spec, new, old):
                plans[alias] = EnginePlan(
                    alias=alias,
                    action="update",
                    fields=spec_changes(was, spec, new, old),
                    note="listed, not served",
                )
    for alias, spec in old.models.items():
        if not spec.served and alias not in new.models and alias not in plans:
            plans[alias] = EnginePlan(alias=alias, action="remove", note="listed, not served")


def _problems(new: Config, facts: Mapping[str, SpecFacts]) -> list[ConfigProblem]:
    out: list[ConfigProblem] = []
    for alias, fact in facts.items():
        spec = new.models.get(alias)
        if spec is None:
            continue
        if fact.refused_flags:
            file, path, _ = field_path(new, spec, "extra_args")
            out.append(
                ConfigProblem(
                    level="error", alias=alias, file=file, path=path, message=fact.refused_flags
                )
            )
        for name, why in fact.missing:
            file, path, _ = field_path(new, spec, name)
            out.append(ConfigProblem(level="error", alias=alias, file=file, path=path, message=why))
        if fact.unchecked:
            out.append(ConfigProblem(level="warning", alias=alias, message=fact.unchecked))
        if fact.fit:
            out.append(
                ConfigProblem(
                    level="warning", alias=alias, message=f"{alias} would not fit now: {fact.fit}"
                )
            )
    return out


def _consequences(
    plans: dict[str, EnginePlan], facts: Mapping[str, SpecFacts], sleeps: Mapping[str, bool]
) -> None:
    """A restart placed now stops (or puts to sleep) the engines in its way."""
    for alias, fact in facts.items():
        plan = plans.get(alias)
        if plan is None or plan.action != "restart":
            continue
        for victim in fact.evicts:
            other = plans.get(victim)
            if other is not None and other.action != "unchanged":
                continue
            action = "sleep" if sleeps.get(victim) else "stop"
            plans[victim] = EnginePlan(
                alias=victim,
                action=action,
                state=other.state if other is not None else "",
                note=f"{'put to sleep' if action == 'sleep' else 'evicted'} when {alias} "
                "restarts: its new launch needs its NUMA nodes or GPUs",
            )
        if fact.waits_for:
            plan.note += f"; its launch waits for {', '.join(fact.waits_for)} to become idle"


def summary(engines: Sequence[EnginePlan], settings: Sequence[SettingChange]) -> str:
    """``restart: alpha (kt.ctx); add: gamma`` or ``no change``."""
    parts = []
    for action in ("restart", "stop", "sleep", "start", "add", "remove", "update"):
        items = []
        for e in engines:
            if e.action == action:
                fields = ", ".join(dict.fromkeys(f.field for f in e.fields))
                items.append(f"{e.alias} ({fields})" if fields and action != "add" else e.alias)
        if items:
            parts.append(f"{action}: {', '.join(items)}")
    if settings:
        parts.append("settings: " + ", ".join(s.field for s in settings))
    return "; ".join(parts) or "no change"


def plan_change(
    old: Config,
    new: Config,
    engines: Mapping[str, Existing],
    facts: Mapping[str, SpecFacts],
    *,
    motion: Mapping[str, str] | None = None,
    sleeps: Mapping[str, bool] | None = None,
    base: str,
    version: str,
    running: str = "",
    changed: Sequence[str] = (),
) -> ConfigPlanView:
    """The plan of going from the engines running ``old`` to ``new``. ``facts``: for each
    new or changed served model; ``motion``: the engines in a load or a swap
    (``in_motion``); ``sleeps``: which engines sleep rather than stop when evicted."""
    got = _engine_plans(old, new, engines)
    sleeps = sleeps or {}
    _consequences(got.engines, facts, sleeps)
    plans = list(got.engines.values())
    problems = _problems(new, facts)
    problems += refusals(plans, motion or {})
    settings = _settings(old, new)
    if base and running and base != running:
        problems.append(
            ConfigProblem(
                level="warning",
                message="the files on disk differ from the config ktd runs (changed by hand "
                "and not reloaded): this plan includes those changes",
            )
        )
    return ConfigPlanView(
        base=base,
        version=version,
        running=running,
        changed=list(changed),
        engines=plans,
        settings=settings,
        problems=problems,
        ok=not any(p.level == "error" for p in problems),
        summary=summary(plans, settings),
    )


def config_error_plan(
    exc_file: str, exc_path: str, message: str, *, base: str, version: str, running: str
) -> ConfigPlanView:
    """The plan of a change whose config does not validate: that error, nothing else."""
    problem = ConfigProblem(level="error", file=exc_file, path=exc_path, message=message)
    where = f"{exc_file}: {exc_path}: " if exc_path else f"{exc_file}: "
    return ConfigPlanView(
        base=base,
        version=version,
        running=running,
        problems=[problem],
        ok=False,
        summary="the config does not validate: " + where + message,
    )


def judged(old: Config | None, new: Config) -> list[ModelSpec]:
    """The served models of ``new`` a plan checks against the machine and their SGLang:
    new ones and those whose launch changed (an untouched model is not judged again)."""
    out = []
    for spec in new.served():
        before = old.models.get(spec.alias) if old is not None else None
        if before is None or not before.served or before.launch_key() != spec.launch_key():
            out.append(spec)
    return out
