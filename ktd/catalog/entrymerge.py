"""A pull's models.json entry into the models.json the user has. Pure.

A user's entry is never overwritten: **a user's flag always wins**. When models.json has
no model under the entry's alias, the pull's entry is added. When it has one (written by
hand, or by an earlier pull: the two are not told apart, so an earlier pull's values are
kept as the user's; a model under another of the catalog entry's names counts too), the
two are merged, the user's side winning at every level:

* every field the user's entry has stays as it is (``path``, ``numa``, ``kt.kt_weight_path``,
  ``kt.ctx``, ...); the pull's fills only the fields it lacks. A ``path`` that is not the
  pulled directory is kept and said (the pull is then not what that alias loads);
* ``kt.extra_args``: the user's flags stay, in their order and form; a flag of the pull's
  is appended only when the user's do not name it (``--kt-num-gpu-experts 12`` of the
  user's beats the derived one, whatever its value).

The notes say what was kept, for the config desk's history and ``ktctl pull``'s output.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Sequence
from typing import Any

from ktd.core.userflags import is_flag, user_flags

__all__ = ["merge_entry"]


def _args(value: Any) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value] if isinstance(value, list) else []


def _split(args: list[str]) -> list[list[str]]:
    """``--a 1 --b --c x`` -> ``[["--a", "1"], ["--b"], ["--c", "x"]]``."""
    groups: list[list[str]] = []
    for a in args:
        if is_flag(a) or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _merge_args(mine: Any, pulled: list[str], notes: list[str]) -> Any:
    have = user_flags(_args(mine))
    added: list[str] = []
    for group in _split(pulled):
        flag = group[0].split("=", 1)[0]
        if flag in have:
            if tuple(group[1:]) != tuple(have[flag]):
                shown = " ".join(have[flag]) or "on"
                notes.append(f"your {flag} {shown} kept (the pull's: {' '.join(group[1:])})")
            continue
        added += group
    if not added:
        return mine
    if isinstance(mine, str):
        return f"{mine} {shlex.join(added)}".strip()
    return [*_args(mine), *added]


def _merge(mine: dict[str, Any], pulled: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(mine)
    if mine.get("path") != pulled.get("path"):
        notes.append(f"your path {mine.get('path')} kept; the pull is in {pulled.get('path')}")
    for key, value in pulled.items():
        if key not in out or out[key] is None:
            out[key] = copy.deepcopy(value)
    kt_mine = out.get("kt")
    kt_pulled = pulled.get("kt") or {}
    if isinstance(kt_mine, dict):
        for key, value in kt_pulled.items():
            if key == "extra_args" and kt_mine.get("extra_args") is not None:
                kt_mine["extra_args"] = _merge_args(kt_mine["extra_args"], value, notes)
            elif key not in kt_mine or kt_mine[key] is None:
                kt_mine[key] = copy.deepcopy(value)
    return out


def _find(models: list[Any], names: Sequence[str]) -> int | None:
    for name in names:
        for i, mine in enumerate(models):
            if isinstance(mine, dict) and mine.get("alias") == name:
                return i
    return None


def merge_entry(
    models: list[Any], entry: dict[str, Any], names: Sequence[str] = ()
) -> tuple[list[Any], str, list[str], str]:
    """``models`` (models.json's list) with ``entry`` added, or merged into the user's
    model of its alias, else of one of ``names`` (the catalog entry's other names: a pull
    by another alias of a model models.json has does not add it twice; the model keeps
    its alias): (the new list, ``added``/``merged``/``unchanged``, notes, the alias)."""
    i = _find(models, [str(entry.get("alias")), *names])
    if i is None:
        return [*models, copy.deepcopy(entry)], "added", [], str(entry.get("alias"))
    mine = models[i]
    alias = str(mine["alias"])
    notes: list[str] = []
    merged = _merge(mine, {**entry, "alias": mine["alias"]}, notes)
    if merged == mine:
        return list(models), "unchanged", notes, alias
    out = list(models)
    out[i] = merged
    return out, "merged", notes, alias
