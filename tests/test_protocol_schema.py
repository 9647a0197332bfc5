"""The control protocol's committed JSON Schema and examples are the types' own.

``docs/protocol/ktd-control-1.2.json`` (and its examples) must be what
``ktd.protocol_schema`` makes of ``ktd.protocol`` today: a change to a message that
is not written there too fails here, with the command that writes it. The 1.0 files
are frozen: made from ``tests/fixtures/protocol_1_0.py``, the protocol module of
commit de80b41 (the protocol before it had a number), byte for byte.
"""

from __future__ import annotations

import hashlib
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import msgspec
import pytest

from ktd import protocol as p
from ktd import protocol_schema as ps

REPO = Path(__file__).resolve().parent.parent
FROZEN_1_0 = REPO / "tests" / "fixtures" / "protocol_1_0.py"
# sha256 of ``git show de80b41:ktd/protocol.py``: the frozen 1.0 module is never edited.
FROZEN_1_0_SHA256 = "8e61be2ab64c4c302c7c16acfbe8e91a89620eb5eade01da83c230b54e127402"


FROZEN_1_1 = REPO / "tests" / "fixtures" / "protocol_1_1.py"
# sha256 of ``git show 411aa56:ktd/protocol.py``, the last 1.1 (1.2 added the pulls).
FROZEN_1_1_SHA256 = "316c5a1db6fb09c3ec4bd5d5b514b9378e3bec00060a07ec6781534162b3a57d"


def protocol_1_0() -> ModuleType:
    return ps.load_module(FROZEN_1_0, "ktd_protocol_1_0")


def protocol_1_1() -> ModuleType:
    return ps.load_module(FROZEN_1_1, "ktd_protocol_1_1")


def committed(version: str, what: str = "") -> Any:
    return msgspec.json.decode((ps.DOCS / f"ktd-control-{version}{what}.json").read_bytes())


def test_the_committed_schema_is_the_types_own() -> None:
    stale = ps.stale(ps.files())
    assert not stale, (
        f"{', '.join(s.name for s in stale)} differ from ktd/protocol.py's types: "
        f"run `{ps.REGENERATE}` and commit the result (a minor change only adds: "
        "docs/protocol.md, 'Compatibility')"
    )


def test_the_committed_schema_names_the_current_version() -> None:
    doc = committed(f"{p.PROTOCOL}")
    assert doc["x-ktd-protocol"] == {"major": p.PROTOCOL.major, "minor": p.PROTOCOL.minor}
    assert doc["x-ktd-features"] == list(p.FEATURES)
    assert doc["$id"] == f"urn:ktd:control:{p.PROTOCOL}"


def test_the_1_0_files_are_de80b41_s_protocol() -> None:
    assert hashlib.sha256(FROZEN_1_0.read_bytes()).hexdigest() == FROZEN_1_0_SHA256
    stale = ps.stale(ps.files(protocol_1_0(), ps.META_1_0))
    assert not stale, f"{stale}: the 1.0 files are frozen; never regenerate them"


def test_the_schema_covers_every_request_reply_and_event() -> None:
    doc = ps.document()
    defs = doc["$defs"]
    requests = {c.__name__ for c in typing.get_args(p.AnyRequest)}
    replies = {c.__name__ for c in typing.get_args(p.AnyReply)}
    assert {r["$ref"].rsplit("/", 1)[-1] for r in defs["Request"]["anyOf"]} == requests
    assert {r["$ref"].rsplit("/", 1)[-1] for r in defs["Reply"]["anyOf"]} == replies
    assert "Event" in defs
    assert defs["Request"]["discriminator"]["propertyName"] == "op"
    assert defs["Reply"]["discriminator"]["propertyName"] == "type"
    assert set(doc["x-ktd-frontend-only"]) <= set(doc["x-ktd-requests"])
    assert doc["x-ktd-error-codes"] == list(p.ERROR_CODES)
    # The document is a valid JSON Schema.
    jsonschema.Draft202012Validator.check_schema(doc)


def test_the_1_1_files_are_411aa56_s_protocol() -> None:
    assert hashlib.sha256(FROZEN_1_1.read_bytes()).hexdigest() == FROZEN_1_1_SHA256
    module = protocol_1_1()
    stale = ps.stale(ps.files(module, ps.meta_of(module)))
    assert not stale, f"{stale}: the 1.1 files are frozen; never regenerate them"


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_every_example_is_valid_and_decodes_with_its_version_s_types(version: str) -> None:
    module = {"1.0": protocol_1_0, "1.1": protocol_1_1, "1.2": lambda: p}[version]()
    doc = committed(version)
    validator = jsonschema.Draft202012Validator(doc)
    examples = committed(version, ".examples")
    kinds = {"request": module.AnyRequest, "reply": module.AnyReply, "event": module.Event}
    names = set()
    for ex in examples:
        validator.validate(ex["message"])
        # msgpack, as on the wire: through that version's own decoder.
        data = msgspec.msgpack.encode(ex["message"])
        decoded = msgspec.msgpack.decode(data, type=kinds[ex["kind"]])
        assert type(decoded).__name__ == ex["name"].split(" ")[0], ex
        names.add(ex["name"].split(" ")[0])
    # One (or two) of every message of that version.
    every = {c.__name__ for u in (module.AnyRequest, module.AnyReply) for c in typing.get_args(u)}
    assert names == every | {"Event"}


def test_open_vocabularies_are_strings_with_their_known_values() -> None:
    """States, error codes and recall kinds are open: a newer daemon may add values, so
    the schema says string (with the known ones), and today's types decode any."""
    defs = ps.document()["$defs"]
    state = defs["EngineInfo"]["properties"]["state"]
    assert state["type"] == "string" and state["examples"] == [s.value for s in p.EngineState]
    assert defs["Error"]["properties"]["code"]["examples"] == list(p.ERROR_CODES)
    assert defs["Recall"]["properties"]["kind"]["examples"] == ["drain", "idle"]


def test_the_cli_prints_checks_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ps.main([]) == 0
    assert capsys.readouterr().out == ps.dumps(ps.document())
    assert ps.main(["--check"]) == 0
    # A file that differs is named, with the command that fixes it.
    wanted = ps.files(docs=tmp_path)
    assert sorted(ps.stale(wanted)) == sorted(wanted)  # missing
    for path, text in wanted.items():
        path.write_text(text)
    assert ps.stale(wanted) == []
    first = next(iter(wanted))
    first.write_text(wanted[first].replace('"type"', '"kind"', 1))
    assert ps.stale(wanted) == [first]


def test_the_schema_pairs_each_request_with_its_replies() -> None:
    """``x-ktd-reply-types`` is ``p.REPLIES`` by tags, and the Node client's copy
    (``clients/node/replies.json``) is written from it; the frozen versions have none."""
    doc = committed(f"{p.PROTOCOL}")
    pairs = doc["x-ktd-reply-types"]
    assert pairs == ps.reply_types()
    assert pairs["load"] == ["load", "plan"] and pairs["sleep"] == ["load"]
    assert set(pairs) == set(doc["x-ktd-requests"])
    assert {r for rs in pairs.values() for r in rs} == set(doc["x-ktd-replies"]) - {"error"}
    assert ps.stale(ps.client_files()) == [], f"run `{ps.REGENERATE}`"
    assert msgspec.json.decode(ps.NODE_REPLIES.read_bytes())["replies"] == pairs
    assert "x-ktd-reply-types" not in committed("1.1")
