"""The text of ``ktctl config``: plans, history, what was applied. Pure (``now`` given).

A plan is read before anything happens, so it says per engine what it does and why
(the fields), then the settings, then the problems with the file and field of each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ktctl.render import one_line, table, truncate
from ktd import protocol as p

#: The longest value a plan line shows (an extra_args list can be long).
VALUE_WIDTH = 60


def value(v: Any) -> str:
    """A JSON value as a plan shows it: ``8192``, ``"auto"``, ``["--x", "1"]``; ``30.0``
    is ``30`` (a whole number of seconds)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    text = json.dumps(v, ensure_ascii=False, separators=(", ", ": "))
    return truncate(one_line(text), VALUE_WIDTH)


def field_text(f: p.FieldChange) -> str:
    """``kt.ctx 0 -> 4096``; a list of flags or a map that loses some of what it held says
    it is replaced and what goes (issue 43: ``kt.extra_args=X`` dropped every other flag,
    and a line cut at 60 characters did not show it)."""
    text = f"{f.field} {value(f.old)} -> {value(f.new)}"
    if isinstance(f.old, list) and isinstance(f.new, list):
        dropped, added = _minus(f.old, f.new), _minus(f.new, f.old)
        if dropped:
            adds = f"; adds {' '.join(added)}" if added else ""
            text = f"{f.field} replaced: {value(f.old)} -> {value(f.new)}"
            text += f" (drops {' '.join(dropped)}{adds})"
    elif isinstance(f.old, dict) and isinstance(f.new, dict):
        gone = [k for k in f.old if k not in f.new]
        if gone:
            text = f"{f.field} replaced: {value(f.old)} -> {value(f.new)} (drops {', '.join(gone)})"
    return text


def _minus(a: Sequence[Any], b: Sequence[Any]) -> list[str]:
    """The words of ``a`` that ``b`` does not have (as many times as ``a`` has more)."""
    rest = [str(x) for x in b]
    out = []
    for x in a:
        if str(x) in rest:
            rest.remove(str(x))
        else:
            out.append(str(x))
    return out


def engine_rows(engines: Sequence[p.EnginePlan]) -> list[list[str]]:
    rows = []
    for e in engines:
        what = "; ".join(field_text(f) for f in e.fields)
        rows.append([e.alias, e.action, e.state or "-", what or "-", one_line(e.note) or "-"])
    return rows


def plan_text(plan: p.ConfigPlanView) -> str:
    """The whole plan for people."""
    head = f"plan: version {plan.base or '?'} -> {plan.version}"
    if plan.changed:
        head += f" (writes {', '.join(plan.changed)})"
    elif plan.ok:
        head += " (the files do not change)"
    out = [head]
    if plan.engines:
        out.append(
            table(["MODEL", "ACTION", "STATE", "CHANGES", "NOTE"], engine_rows(plan.engines))
        )
    if plan.settings:
        out.append("settings:")
        out.extend(
            f"  {s.field} {value(s.old)} -> {value(s.new)} ({s.effect})" for s in plan.settings
        )
    if plan.problems:
        out.append("problems:")
        for q in plan.problems:
            where = f"{q.file}: {q.path}: " if q.path else ""
            out.append(f"  {q.level}: {where}{one_line(q.message)}")
    out.append(("ok: " if plan.ok else "refused: ") + one_line(plan.summary))
    return "\n".join(out)


def applied_text(reply: p.ConfigApplyReply) -> str:
    if reply.summary == "no change" and reply.seq is None:
        return "nothing to apply: the files are what ktd runs"
    seq = f" (history #{reply.seq})" if reply.seq is not None else ""
    return f"applied version {reply.version}{seq}: {one_line(reply.summary)}"


def who(v: p.ConfigVersion) -> str:
    """``alice (uid 1000)``; what the client claimed, when it differs, marked as such."""
    real = v.user or (f"uid {v.uid}" if v.uid is not None else "ktd")
    if v.uid is not None and v.user:
        real = f"{v.user} (uid {v.uid})"
    claimed = one_line(v.claimed)
    if claimed and claimed != v.user:
        real += f", claimed {claimed!r}"
    return real


def history_table(reply: p.ConfigHistoryReply, now: float | None = None) -> str:
    if not reply.versions:
        return "no versions kept yet"
    rows = []
    for v in reply.versions:
        marks = []
        if v.version == reply.disk:
            marks.append("files")
        if v.version == reply.running:
            marks.append("running")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.time))
        how = v.how + (f" of #{v.rollback_of}" if v.rollback_of else "")
        rows.append(
            [
                str(v.seq),
                v.version,
                ",".join(marks) or "-",
                stamp,
                how,
                who(v),
                truncate(one_line(v.what), 70) or "-",
            ]
        )
    text = table(["#", "VERSION", "NOW", "WHEN", "HOW", "WHO", "WHAT"], rows)
    if reply.disk not in {v.version for v in reply.versions}:
        text += (
            f"\nthe files on disk ({reply.disk}) are not a version yet: `ktctl reload` records them"
        )
    return (
        text + f"\n(ktd keeps {reply.keep} versions: the files now and the {reply.keep - 1} before)"
    )
