"""Reading the catalog: the built-in file, then the operator's own, each validated.

A bad operator file (no JSON, a misspelt field, a wrong type, another format number, an
entry whose variant names a source it lacks) is reported, with its file and the field,
and left out; the built-in catalog and the other files still load. So a typo in
``/etc/ktd/catalog.d/mine.json`` never takes ``ktctl catalog`` or a pull down. An
operator's entry of the same name as a built-in one replaces it (said in the notes of
the result), so a site can pin its own revision of a model ktd ships.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import msgspec

from ktd.catalog.schema import FORMAT, CatalogFile, Entry

__all__ = [
    "BUILTIN",
    "LoadedCatalog",
    "Problem",
    "builtin_text",
    "load",
    "parse",
]

BUILTIN = "builtin.json"  # the file's name as problems and the report name it
_MAX_FILE = 4 << 20


@dataclass(frozen=True)
class Problem:
    """What is wrong with one catalog file: which file, which field (a JSON path, ``$``
    for the whole file), and why."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


@dataclass(frozen=True)
class LoadedCatalog:
    """The entries that loaded (by name, in file order), where each came from, and the
    problems of the files that did not (or only partly) load."""

    entries: tuple[Entry, ...] = ()
    origin: dict[str, str] = field(default_factory=dict)  # entry name -> file
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def find(self, name: str) -> Entry | None:
        """The entry called ``name`` or with it as an alias (case does not matter)."""
        key = name.lower()
        for e in self.entries:
            if e.name == key or key in e.aliases:
                return e
        return None


_AT = re.compile(r" - at `(\$[^`]*)`$")


def _validation(file: str, exc: msgspec.ValidationError) -> Problem:
    """msgspec says ``Expected `int`, got `str` - at `$.models[0].x```: split the path off."""
    text = str(exc)
    m = _AT.search(text)
    if m:
        return Problem(file, m.group(1), text[: m.start()])
    return Problem(file, "$", text)


def parse(file: str, text: str | bytes) -> tuple[list[Entry], list[Problem]]:
    """The entries of one file's text, and its problems. A file that does not decode gives
    no entry; an entry whose parts do not agree is left out alone."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return [], [Problem(file, "$", f"not JSON: {exc}")]
    if isinstance(raw, dict) and raw.get("catalog") != FORMAT:
        got = raw.get("catalog")
        return [], [
            Problem(file, "$.catalog", f"is {got!r}; this ktd reads catalog format {FORMAT}")
        ]
    try:
        doc = msgspec.convert(raw, CatalogFile)
    except msgspec.ValidationError as exc:
        return [], [_validation(file, exc)]
    entries: list[Entry] = []
    problems: list[Problem] = []
    for i, entry in enumerate(doc.models):
        found = _entry_problems(file, f"$.models[{i}]", entry)
        problems.extend(found)
        if not found:
            entries.append(entry)
    return entries, problems


def _entry_problems(file: str, at: str, e: Entry) -> list[Problem]:
    out: list[Problem] = []
    if not e.variants:
        out.append(Problem(file, f"{at}.variants", "lists no variant"))
    if e.source("model") is None:
        out.append(Problem(file, f"{at}.sources", 'has no source of role "model"'))
    models = [i for i, s in enumerate(e.sources) if s.role == "model"]
    if len(models) > 1:
        out.append(Problem(file, f"{at}.sources[{models[1]}].role", 'is a second "model"'))
    for i, s in enumerate(e.sources):
        if s.role == "kt-weights" and not s.methods:
            out.append(Problem(file, f"{at}.sources[{i}].methods", "is empty: which --kt-method?"))
    names = [v.name for v in e.variants]
    for j, v in enumerate(e.variants):
        vat = f"{at}.variants[{j}]"
        if names.count(v.name) > 1:
            out.append(Problem(file, f"{vat}.name", f"{v.name!r} is used twice"))
        if v.weights == "kt-weights" and e.source("kt-weights", v.kt_method) is None:
            out.append(
                Problem(
                    file,
                    f"{vat}.weights",
                    f'is "kt-weights" but no such source is for {v.kt_method}',
                )
            )
        if v.weights == "convert" and not v.convert:
            out.append(Problem(file, f"{vat}.convert", "is empty: say how to convert"))
        if v.weights != "model" and v.kt_method is None:
            out.append(
                Problem(file, f"{vat}.kt_method", "is null but the weights are not the model's")
            )
    if e.name in e.aliases:
        out.append(Problem(file, f"{at}.aliases", f"repeats the name {e.name!r}"))
    return out


def builtin_text() -> bytes:
    return resources.files("ktd.catalog").joinpath(BUILTIN).read_bytes()


def _read(path: Path) -> bytes | str:
    with path.open("rb") as f:
        data = f.read(_MAX_FILE + 1)
    if len(data) > _MAX_FILE:
        raise OSError(f"larger than {_MAX_FILE >> 20} MiB")
    return data


def load(
    files: Sequence[str | Path] = (), *, base: Path | None = None, builtin: bool = True
) -> LoadedCatalog:
    """The built-in catalog, then ``files`` (relative ones to ``base``: config.json's
    directory), later names replacing earlier ones. Never raises for a file's content or
    absence: that is a problem of the result."""
    texts: list[tuple[str, bytes | str | OSError]] = []
    if builtin:
        texts.append((BUILTIN, builtin_text()))
    for f in files:
        path = Path(f)
        if not path.is_absolute() and base is not None:
            path = base / path
        try:
            texts.append((str(path), _read(path)))
        except OSError as exc:
            texts.append((str(path), exc))
    return merge(texts)


def merge(texts: Iterable[tuple[str, bytes | str | OSError]]) -> LoadedCatalog:
    """Parse each file's text in order into one catalog (pure; ``load`` reads them)."""
    by_name: dict[str, Entry] = {}
    origin: dict[str, str] = {}
    problems: list[Problem] = []
    notes: list[str] = []
    files: list[str] = []
    for name, text in texts:
        files.append(name)
        if isinstance(text, OSError):
            problems.append(Problem(name, "$", f"cannot be read: {text.strerror or text}"))
            continue
        entries, found = parse(name, text)
        problems.extend(found)
        for e in entries:
            if e.name in by_name:
                notes.append(f"{name}: {e.name} replaces the entry of {origin[e.name]}")
                del by_name[e.name]
            by_name[e.name] = e
            origin[e.name] = name
    kept, clash = _aliases(list(by_name.values()), origin)
    problems.extend(clash)
    return LoadedCatalog(tuple(kept), origin, tuple(problems), tuple(notes), tuple(files))


def _aliases(entries: list[Entry], origin: dict[str, str]) -> tuple[list[Entry], list[Problem]]:
    """A name may mean one entry only: an alias that is another entry's name or alias is
    dropped from the later entry (reported), the entry itself kept."""
    taken: dict[str, str] = {e.name: e.name for e in entries}
    out: list[Entry] = []
    problems: list[Problem] = []
    for e in entries:
        keep = []
        for j, a in enumerate(e.aliases):
            owner = taken.get(a)
            if owner is not None and owner != e.name:
                problems.append(
                    Problem(
                        origin[e.name], f"{e.name}.aliases[{j}]", f"{a!r} already names {owner}"
                    )
                )
                continue
            taken[a] = e.name
            keep.append(a)
        out.append(e if keep == e.aliases else msgspec.structs.replace(e, aliases=keep))
    return out, problems
