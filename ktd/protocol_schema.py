"""The control protocol as JSON Schema, and a corpus of example messages: made from the
msgspec types of ``ktd.protocol`` (or of an older protocol's frozen module).

Why generated: the types are the protocol (the daemon and ktctl decode with them), so
a hand-written schema would drift from them. ``docs/protocol/ktd-control-M.m.json`` is
this module's output for the current version, committed, and a test fails when the
types and the file differ; ``python -m ktd.protocol_schema --write`` writes it again
(with its examples, ``ktd-control-M.m.examples.json``). The examples are generated
from the schema itself (every field set, and only the required ones), so each version
has a corpus that tests decode with the other version's types (tests/test_protocol_compat.py).

Pure: msgspec, json and the standard library (the daemon answers the ``schema``
request with ``document()``; ktctl imports it for ``ktctl schema --local``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from ktd import protocol as p

__all__ = [
    "DOCS",
    "NODE_REPLIES",
    "REGENERATE",
    "Meta",
    "client_files",
    "document",
    "dumps",
    "examples",
    "files",
    "load_module",
    "main",
    "meta_of",
    "node_table",
    "reply_types",
]

#: Where the committed documents live (a source checkout's; not in the installed package).
DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol"
#: The Node client's copy of the request -> reply table (``clients/node``), written with
#: the schema: an npm package carries no docs/, and JSON is what Node reads without a
#: parser of its own.
NODE_REPLIES = DOCS.parent.parent / "clients" / "node" / "replies.json"
#: The one command that regenerates the current version's files (the drift test says it).
REGENERATE = "python -m ktd.protocol_schema --write"


@dataclass(frozen=True)
class Meta:
    """What the schema says beyond the types: the version and its vocabularies."""

    major: int
    minor: int
    features: tuple[str, ...]
    error_codes: tuple[str, ...]
    frontend_only: frozenset[str]

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}"


#: The metadata of protocol 1.0 (it had no number, no feature list: ``Pong`` said only
#: the release), as ``docs/protocol/ktd-control-1.0.json`` records it.
META_1_0 = Meta(
    major=1,
    minor=0,
    features=p.FEATURES_1_0,
    error_codes=(
        "unknown_model",
        "not_kt",
        "load_failed",
        "busy",
        "timeout",
        "bad_request",
        "not_loaded",
        "config_error",
        "queue_full",
        "shutting_down",
        "internal",
        "no_sleep",
    ),
    frontend_only=p.FRONTEND_ONLY,
)


def meta_of(module: ModuleType) -> Meta:
    """The metadata of a frozen protocol module: 1.0 had none (``META_1_0``); from 1.1 on
    the module says its version, features and codes itself."""
    version = getattr(module, "PROTOCOL", None)
    if version is None:
        return META_1_0
    return Meta(
        major=version.major,
        minor=version.minor,
        features=module.FEATURES,
        error_codes=module.ERROR_CODES,
        frontend_only=module.FRONTEND_ONLY,
    )


def current_meta() -> Meta:
    return Meta(
        major=p.PROTOCOL.major,
        minor=p.PROTOCOL.minor,
        features=p.FEATURES,
        error_codes=p.ERROR_CODES,
        frontend_only=p.FRONTEND_ONLY,
    )


def load_module(path: Path, name: str) -> ModuleType:
    """Import a frozen protocol module (an older version's ``protocol.py``) by its path.

    Registered in ``sys.modules`` under ``name`` first: msgspec resolves the types'
    postponed annotations through the module they were defined in."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tag(message: Any) -> str:
    return str(message.__struct_config__.tag)


def _tags(union: Any) -> list[str]:
    return [_tag(t) for t in union.__args__]


def reply_types(module: ModuleType = p) -> dict[str, list[str]] | None:
    """Request op -> the reply types that answer it (``module.REPLIES``, by their tags;
    ``error`` answers any and is not listed). None for a module without the table: the
    frozen 1.0 and 1.1 modules, whose files stay as they were."""
    table = getattr(module, "REPLIES", None)
    if table is None:
        return None
    return {_tag(req): [_tag(r) for r in reps] for req, reps in table.items()}


def document(module: ModuleType = p, meta: Meta | None = None) -> dict[str, Any]:
    """The JSON Schema (2020-12) of every request, reply and event of ``module``.

    ``$defs`` has each message and each struct inside one by its class name, plus
    ``Request`` and ``Reply`` (the tagged unions: ``op`` and ``type``); the document
    itself matches any of the three. ``x-ktd-*`` keys carry what the types do not:
    ``x-ktd-reply-types`` pairs each request with its replies, so that no client writes
    the pairing again.
    """
    meta = meta or current_meta()
    (request, reply, _event), defs = msgspec.json.schema_components(
        [module.AnyRequest, module.AnyReply, module.Event], ref_template="#/$defs/{name}"
    )
    defs = dict(sorted(defs.items()))
    defs["Request"] = request
    defs["Reply"] = reply
    pairs = reply_types(module)
    paired = {"x-ktd-reply-types": pairs} if pairs is not None else {}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:ktd:control:{meta.version}",
        "title": f"ktd control protocol {meta.version}",
        "description": (
            "Every message on ktd's control socket (requests tagged by `op`, replies by "
            "`type`) and on its events socket (`Event`), msgpack on the wire. Unknown "
            "fields are ignored by both sides; docs/protocol.md has the framing and the "
            "compatibility rules."
        ),
        "x-ktd-protocol": {"major": meta.major, "minor": meta.minor},
        "x-ktd-features": list(meta.features),
        "x-ktd-requests": _tags(module.AnyRequest),
        "x-ktd-replies": _tags(module.AnyReply),
        "x-ktd-frontend-only": sorted(meta.frontend_only),
        "x-ktd-error-codes": list(meta.error_codes),
        **paired,
        "anyOf": [
            {"$ref": "#/$defs/Request"},
            {"$ref": "#/$defs/Reply"},
            {"$ref": "#/$defs/Event"},
        ],
        "$defs": defs,
    }


@functools.cache
def current() -> dict[str, Any]:
    """``document()`` of this ktd, made once (the daemon's ``schema`` reply)."""
    return document()


def dumps(doc: Any) -> str:
    """The one spelling of a committed document: stable, diffable, with a final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- examples


class _Maker:
    """Values for a schema node: deterministic, within its bounds, every field set
    (``full``) or only the required ones."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def value(self, node: dict[str, Any], *, full: bool, depth: int = 0) -> Any:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return self.value(self.defs[name], full=full, depth=depth + 1)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            return self.value(options[0], full=full, depth=depth)
        if "enum" in node:
            return node["enum"][0]
        if "examples" in node:
            return node["examples"][0]
        kind = node.get("type")
        if kind == "object" and "properties" in node:
            return self.struct(node, full=full, depth=depth)
        if kind == "object":
            extra = node.get("additionalProperties", {})
            if not full or depth > 6 or not extra:
                return {}
            return {"key": self.value(extra, full=full, depth=depth + 1)}
        if kind == "array":
            if "prefixItems" in node:  # an array-like struct
                return [self.value(i, full=full, depth=depth + 1) for i in node["prefixItems"]]
            if not full or depth > 6:
                return []
            return [self.value(node.get("items", {}), full=full, depth=depth + 1)]
        if kind == "string":
            return _string(node)
        if kind == "integer":
            return max(node.get("minimum", 1), 1) if full else node.get("minimum", 0)
        if kind == "number":
            return 1.5
        if kind == "boolean":
            return True
        return None  # Any: null is a value of every JSON type's union

    def struct(self, node: dict[str, Any], *, full: bool, depth: int) -> dict[str, Any]:
        required = set(node.get("required", ()))
        out: dict[str, Any] = {}
        for name, prop in node["properties"].items():
            if full or name in required:
                out[name] = self.value(prop, full=full, depth=depth + 1)
        return out


_PATTERNED = {
    r"^\d{4}-\d{2}-\d{2}$": "2026-01-31",
    r"^(\d{4}-\d{2}-\d{2})?$": "2026-01-31",
    r"^[0-9a-f]*$": "d11214ffe8a4",  # a config version id
}


def _string(node: dict[str, Any]) -> str:
    if "pattern" in node:
        return str(_PATTERNED[node["pattern"]])
    length: int = max(1, min(node.get("minLength", 1), node.get("maxLength", 1)))
    return "x" * length


def _messages(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, definition name) of every message: each request, each reply, the event."""
    defs = doc["$defs"]
    for kind, union in (("request", "Request"), ("reply", "Reply")):
        for option in defs[union]["anyOf"]:
            yield kind, option["$ref"].rsplit("/", 1)[-1]
    yield "event", "Event"


def examples(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One message of every request, reply and event with every field set, and one with
    only the required fields where that differs: ``{"kind", "name", "message"}``."""
    maker = _Maker(doc["$defs"])
    out: list[dict[str, Any]] = []
    for kind, name in _messages(doc):
        full = maker.value({"$ref": f"#/$defs/{name}"}, full=True)
        out.append({"kind": kind, "name": name, "message": full})
        minimal = maker.value({"$ref": f"#/$defs/{name}"}, full=False)
        if minimal != full:
            out.append({"kind": kind, "name": f"{name} (required fields only)", "message": minimal})
    return out


# ---------------------------------------------------------------- files


def files(module: ModuleType = p, meta: Meta | None = None, docs: Path = DOCS) -> dict[Path, str]:
    """The committed files of one version: its schema and its examples, with their text."""
    meta = meta or current_meta()
    doc = document(module, meta)
    stem = docs / f"ktd-control-{meta.version}"
    return {
        stem.with_name(stem.name + ".json"): dumps(doc),
        stem.with_name(stem.name + ".examples.json"): dumps(examples(doc)),
    }


def client_files() -> dict[Path, str]:
    """The files clients ship, made from the current version's schema: the Node
    client's request -> reply table."""
    return {NODE_REPLIES: dumps(node_table(current()))}


def node_table(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``clients/node/replies.json`` holds: the schema's request -> reply table and
    the version it is of."""
    return {
        "generated": f"by `{REGENERATE}` from {doc['$id']}: do not edit",
        "protocol": doc["x-ktd-protocol"],
        "replies": doc["x-ktd-reply-types"],
    }


def stale(wanted: dict[Path, str]) -> list[Path]:
    """The files whose committed text is not ``wanted``'s (missing ones included)."""
    out = []
    for path, text in wanted.items():
        try:
            if path.read_text() != text:
                out.append(path)
        except FileNotFoundError:
            out.append(path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ktd.protocol_schema",
        description="Print (or write, or check) the control protocol's JSON Schema.",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write the current version's files into {DOCS} (and {NODE_REPLIES.name})",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the committed files differ"
    )
    parser.add_argument(
        "--module",
        type=Path,
        metavar="PATH",
        help="an older version's frozen protocol.py (tests/fixtures/protocol_1_<minor>.py)",
    )
    args = parser.parse_args(argv)
    if args.module is not None:
        module = load_module(args.module, "ktd_protocol_frozen")
        wanted = files(module, meta_of(module))
    else:
        wanted = {**files(), **client_files()}
    if args.write:
        for path, text in wanted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    if args.check:
        bad = stale(wanted)
        for path in bad:
            print(f"{path} differs from the types: run `{REGENERATE}`", file=sys.stderr)
        return 1 if bad else 0
    sys.stdout.write(next(iter(wanted.values())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
