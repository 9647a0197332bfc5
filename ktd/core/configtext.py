"""Edits of ``models.json`` as a person would make them: the file stays the user's. Pure.

When ``ktctl config set`` or the dashboard's form changes one field, the file is not
re-dumped: only the changed value's text is replaced, in the layout around it (one
line or one member per line, the indentation, the key order, the spelling of every
untouched value: ``600`` stays ``600``, not ``600.0``); a new field goes last in its
object, in the style of its siblings; a removed entry takes its separator with it. So
hand edits and ktd's edits mix, and ``git diff`` of the file shows the change and
nothing else. A whole text from the user (``ktctl config apply FILE``, the dashboard's
raw view) is written as given, never re-formatted.

The text is first read by ``json.loads`` (so it is valid JSON; through ``ktd.foreign``,
so it is nested no deeper than the scanner's recursion can follow), then a small scanner
finds where each value lies. Imported by ktctl: the standard library and ``ktd.foreign``
only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ktd import foreign

__all__ = [
    "EditError",
    "add_entry",
    "entries",
    "find_entry",
    "remove_entry",
    "replace_entry",
    "set_fields",
    "version_of",
]


class EditError(ValueError):
    """An edit that cannot be made (the file is no JSON list, no such alias, ...)."""


def version_of(config: bytes, models_name: str, models: bytes | None) -> str:
    """A version's id: the first 12 hex digits of the SHA-256 of both files (and where
    the models are). Equal files, equal id: a rollback to a version gets its id again."""
    import hashlib  # here: ktctl imports this module and OpenSSL costs its start-up 3 ms

    h = hashlib.sha256()
    h.update(b"config\0" + config + b"\0models\0" + models_name.encode() + b"\0")
    h.update(models if models is not None else b"\xff(none)")
    return h.hexdigest()[:12]


# ---------------------------------------------------------------- where values lie


@dataclass
class _Node:
    start: int
    end: int  # text[start:end] is the value
    members: list[tuple[int, int, _Node]] = field(default_factory=list)  # key span, value
    items: list[_Node] = field(default_factory=list)
    kind: str = "scalar"  # "object", "array", "scalar"


_WS = " \t\n\r"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int:
    j = i + 1
    while text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _scan(text: str, i: int) -> _Node:
    """The value starting at ``text[i]`` (``text`` is valid JSON: no checks)."""
    c = text[i]
    if c == '"':
        return _Node(i, _string_end(text, i))
    if c not in "{[":
        j = i
        while j < len(text) and text[j] not in ",]}" + _WS:
            j += 1
        return _Node(i, j)
    node = _Node(i, i, kind="object" if c == "{" else "array")
    close = "}" if c == "{" else "]"
    j = _skip(text, i + 1)
    while text[j] != close:
        if c == "{":
            k_end = _string_end(text, j)
            value = _scan(text, _skip(text, _skip(text, k_end) + 1))
            node.members.append((j, k_end, value))
        else:
            value = _scan(text, j)
            node.items.append(value)
        j = _skip(text, value.end)
        if text[j] == ",":
            j = _skip(text, j + 1)
    node.end = j + 1
    return node


# ---------------------------------------------------------------- rendering in the file's style


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``600`` and ``600.0`` are one number (a page's JavaScript
    sends the one it read either way; the file keeps its spelling), ``true`` is no ``1``."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        if isinstance(a, bool) or isinstance(b, bool):
            return a is b
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@dataclass(frozen=True)
class _Style:
    text: str
    unit: str  # one level of indentation

    @classmethod
    def of(cls, text: str) -> _Style:
        widths = []
        for line in text.splitlines()[1:]:
            if line.startswith("\t"):
                return cls(text, "\t")
            stripped = line.lstrip(" ")
            if stripped and len(stripped) < len(line):
                widths.append(len(line) - len(stripped))
        return cls(text, " " * min(widths) if widths else "  ")

    def line_indent(self, at: int) -> str:
        """The leading whitespace of the line holding ``text[at]``."""
        begin = self.text.rfind("\n", 0, at) + 1
        end = begin
        while end < len(self.text) and self.text[end] in " \t":
            end += 1
        return self.text[begin:end]

    def fresh(self, value: Any, *, multiline: bool, indent: str) -> str:
        """A new value: one line, or one member per line from ``indent`` on."""
        if not multiline or not isinstance(value, dict | list) or not value:
            return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        out = json.dumps(value, ensure_ascii=False, indent=self.unit)
        return out.replace("\n", "\n" + indent)


def _render(new: Any, old: Any, node: _Node | None, style: _Style, indent: str, multi: bool) -> str:
    """``new`` where ``old`` was written at ``node`` (None: nowhere yet): untouched text
    stays as it was written; a changed object keeps its layout member by member."""
    if node is None:
        return style.fresh(new, multiline=multi, indent=indent)
    if _same(new, old):
        return style.text[node.start : node.end]
    written = style.text[node.start : node.end]
    if isinstance(new, dict) and isinstance(old, dict) and node.kind == "object" and node.members:
        return _object(new, old, node, style)
    return style.fresh(new, multiline="\n" in written, indent=style.line_indent(node.start))


def _object(new: dict[str, Any], old: dict[str, Any], node: _Node, style: _Style) -> str:
    text = style.text
    first_key, _, _ = node.members[0]
    last_value = node.members[-1][2]
    opening = text[node.start + 1 : first_key]
    closing = text[last_value.end : node.end - 1]
    colon = text[node.members[0][1] : node.members[0][2].start]
    multi = "\n" in text[node.start : node.end]
    if len(node.members) > 1:
        standard = text[node.members[0][2].end : node.members[1][0]]
    else:
        standard = "," + (opening if multi else " ")
    member_indent = style.line_indent(first_key) if multi else style.line_indent(node.start)
    where: dict[str, tuple[int, int, _Node, int]] = {}
    for n, (k_start, k_end, value) in enumerate(node.members):
        where[json.loads(text[k_start:k_end])] = (k_start, k_end, value, n)
    parts: list[str] = []
    previous = -2
    for key in new:
        found = where.get(key)
        if found is not None and key in old:
            k_start, _, value, n = found
            body = text[k_start : value.start] + _render(
                new[key], old[key], value, style, member_indent, multi
            )
        else:
            n = -2
            body = json.dumps(key, ensure_ascii=False) + colon
            body += style.fresh(new[key], multiline=multi, indent=member_indent)
        if parts:
            adjacent = n >= 0 and n == previous + 1
            parts.append(
                text[node.members[previous][2].end : node.members[n][0]] if adjacent else standard
            )
        parts.append(body)
        previous = n
    if not parts:
        return "{}"
    return "{" + opening + "".join(parts) + closing + "}"


# ---------------------------------------------------------------- models.json


def entries(text: str) -> list[dict[str, Any]]:
    """The entries of a models.json text; EditError if it is no JSON list of objects."""
    try:
        value = foreign.loads(text)
    except ValueError as exc:  # foreign.Malformed too: nested too deeply
        raise EditError(f"models.json is not valid JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise EditError("models.json is not a JSON list of model entries")
    return value


def find_entry(text: str, alias: str) -> int:
    """The index of ``alias``'s entry; EditError naming the aliases there are."""
    listed = entries(text)
    for i, entry in enumerate(listed):
        if entry.get("alias") == alias:
            return i
    names = ", ".join(str(e.get("alias")) for e in listed) or "none"
    raise EditError(f"no entry with alias {alias!r} in models.json (there are: {names})")


def _top(text: str) -> _Node:
    start = _skip(text, 0)
    node = _scan(text, start)
    if node.kind != "array":
        raise EditError("models.json is not a JSON list of model entries")
    return node


def replace_entry(text: str, index: int, entry: Mapping[str, Any]) -> str:
    """``text`` with entry ``index`` now ``entry``, written in that entry's own layout."""
    listed = entries(text)
    node = _top(text)
    style = _Style.of(text)
    item = node.items[index]
    rendered = _render(dict(entry), listed[index], item, style, style.line_indent(item.start), True)
    return text[: item.start] + rendered + text[item.end :]


def add_entry(text: str | None, entry: Mapping[str, Any]) -> str:
    """``text`` with ``entry`` last, in the style of the entry before it (a new file, or
    one with no entry yet: one member per line, two spaces)."""
    if text is None or not text.strip():
        return json.dumps([dict(entry)], ensure_ascii=False, indent=2) + "\n"
    entries(text)
    node = _top(text)
    style = _Style.of(text)
    if not node.items:
        body = style.fresh(dict(entry), multiline=True, indent=style.unit)
        return text[: node.start] + "[\n" + style.unit + body + "\n]" + text[node.end :]
    last = node.items[-1]
    written = text[last.start : last.end]
    indent = style.line_indent(last.start)
    body = style.fresh(dict(entry), multiline="\n" in written, indent=indent)
    if len(node.items) > 1:
        sep = text[node.items[-2].end : last.start]
    else:
        opening = text[node.start + 1 : last.start]
        sep = "," + (opening if "\n" in opening else " ")
    return text[: last.end] + sep + body + text[last.end :]


def remove_entry(text: str, alias: str) -> str:
    """``text`` without ``alias``'s entry (and the separator before it, or after it when
    it is the first)."""
    index = find_entry(text, alias)
    node = _top(text)
    items = node.items
    item = items[index]
    if len(items) == 1:
        return text[: node.start] + "[]" + text[node.end :]
    if index > 0:
        return text[: items[index - 1].end] + text[item.end :]
    return text[: item.start] + text[items[1].start :]


def _dotted(entry: dict[str, Any], path: str, *, create: bool) -> tuple[dict[str, Any], str]:
    """The object holding ``path``'s last part (``kt.ctx``: the ``kt`` object, created
    last in the entry when missing and ``create``) and that part."""
    parts = path.split(".")
    holder = entry
    for part in parts[:-1]:
        inner = holder.get(part)
        if inner is None:
            if not create:
                return {}, parts[-1]
            inner = holder[part] = {}
        if not isinstance(inner, dict):
            raise EditError(f"{path}: {part} is not an object in this entry")
        holder = inner
    return holder, parts[-1]


def set_fields(
    text: str,
    alias: str,
    values: Mapping[str, Any],
    unset: Sequence[str] = (),
) -> str:
    """``text`` with fields of ``alias``'s entry set (a new field goes last in its object)
    and ``unset`` ones removed (back to their default)."""
    index = find_entry(text, alias)
    entry = json.loads(json.dumps(entries(text)[index]))  # a copy to change
    for path, value in values.items():
        holder, key = _dotted(entry, path, create=True)
        holder[key] = value
    for path in unset:
        holder, key = _dotted(entry, path, create=False)
        holder.pop(key, None)
    return replace_entry(text, index, entry)
