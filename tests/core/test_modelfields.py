"""The table of models.json's fields: every one is the schema's, each kind reads its
values, an unknown field or a wrong value names the field (issue 39)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ktd.core import secret
from ktd.core.config import LAUNCH_FIELDS, KtOverrides, ModelEntry, ModelSpec
from ktd.core.modelfields import (
    ENTRY,
    FIELDS,
    LAUNCH,
    SECTION_ONLY,
    FieldValueError,
    field,
    parse_value,
    readme_lines,
)
from tests.fixtures.specs import kt_spec


def test_every_field_is_one_of_the_schemas() -> None:
    entry = {f.name for f in msgspec.structs.fields(ModelEntry)}
    kt = {f.name for f in msgspec.structs.fields(KtOverrides)}
    for f in FIELDS:
        if f.name.startswith("kt."):
            assert f.name[3:] in kt, f.name
        else:
            assert f.name in entry, f.name
    # ... and every field people set is offered (the multi-node ones are config errors).
    offered = {f.name for f in FIELDS}
    assert entry - {"kt"} <= offered
    assert {f"kt.{n}" for n in kt} - offered == {"kt.nnodes", "kt.dist_init_addr", "kt.nodes"}


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("ttl", "600", 600),
        ("ttl", "1.5", 1.5),
        ("kt.ctx", "8192", 8192),
        ("pinned", "yes", True),
        ("sleep", "false", False),
        ("fit", "ignore", "ignore"),
        ("numa", "auto", "auto"),
        ("numa", "0,1", [0, 1]),
        ("numa", "[1]", [1]),
        ("gpus", "2", 2),
        ("gpus", "0,1", [0, 1]),
        ("kt.extra_args", "--tp 2 --kt-method AMXINT4", ["--tp", "2", "--kt-method", "AMXINT4"]),
        ("kt.extra_args", '["--x", "a b"]', ["--x", "a b"]),
        ("kt.extra_env", "A=1 B='two words'", {"A": "1", "B": "two words"}),
        ("kt.extra_env", '{"A": "1"}', {"A": "1"}),
        ("max_concurrent", "null", None),
        ("max_queue", "0", 0),
        ("path", "/models/<x>", "/models/<x>"),
    ],
)
def test_values_by_kind(name: str, text: str, value: object) -> None:
    assert parse_value(name, text) == value


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("ttll", "1", "ttll: not a field of a models.json entry (did you mean ttl?)"),
        ("ttl", "soon", "ttl: expected a number of seconds, got 'soon'"),
        ("ttl", "-1", "ttl: must be >= 0"),
        ("kt.ctx", "1.5", "kt.ctx: expected a whole number"),
        ("pinned", "maybe", "pinned: expected true or false"),
        ("fit", "sometimes", "fit: expected one of check, ignore"),
        ("numa", "a,b", "numa: expected a list of numbers"),
        ("kt.extra_env", "NOEQUALS", "kt.extra_env: expected NAME=VALUE words"),
        ("kt.extra_args", "'unclosed", "kt.extra_args: cannot split like a shell"),
        ("ttl", "nan", "ttl: expected a finite number"),
    ],
)
def test_a_bad_value_names_its_field(name: str, text: str, message: str) -> None:
    with pytest.raises(FieldValueError) as info:
        parse_value(name, text)
    assert str(info.value).startswith(message)


def test_the_readme_lists_every_field_with_its_meaning() -> None:
    text = "\n".join(readme_lines())
    for f in FIELDS:
        assert f"  {f.name} " in text
    assert max(len(line) for line in readme_lines()) <= 80
    assert field("kt.ctx").to_dict()["kind"] == "int"


# ---------------------------------------------------------------- the one table (issue 45)


def test_the_table_is_every_field_of_an_entry_and_no_other() -> None:
    """models.json's fields are declared once: a field of the schema missing from the
    table (or one the schema lacks) fails here, before a plan could name it wrongly."""
    entry = {f.name for f in msgspec.structs.fields(ModelEntry)} - {"kt"}
    kt = {f"kt.{f.name}" for f in msgspec.structs.fields(KtOverrides)}
    assert [f.name for f in ENTRY] == list(dict.fromkeys(f.name for f in ENTRY))  # once each
    assert {f.name for f in ENTRY} == entry | kt


def test_every_resolved_field_comes_from_the_table() -> None:
    """A resolved model's fields: an entry's (by the table), the section's alone, or
    ktd's own bookkeeping; nothing else."""
    spec = set(ModelSpec.__struct_fields__)
    from_entries = {f.spec for f in ENTRY} & spec
    from_section = {name for name, _, _ in SECTION_ONLY}
    assert spec == from_entries | from_section | {"source", "not_served_reason"}
    assert not from_entries & from_section
    assert {f.spec for f in ENTRY} - spec == {"nodes"}  # kt.nodes: refused, never resolved


def _hint(name: str) -> Any:
    if name.startswith("kt."):
        return secret.hints(KtOverrides)[name[3:]]
    return secret.hints(ModelEntry)[name]


def test_the_secret_marks_are_the_types() -> None:
    """The table's secret fields are exactly those the types mark (which the redaction
    reads), in an entry and in a resolved model."""
    for f in ENTRY:
        assert f.secret == secret.holds_secret(_hint(f.name)), f.name
    spec_hints = secret.hints(ModelSpec)
    marked = {name for name, tp in spec_hints.items() if secret.holds_secret(tp)}
    assert marked == {f.spec for f in ENTRY if f.secret}


def test_the_launch_is_the_tables_launch_fields() -> None:
    """``launch_key`` is read off the table: changing a field changes it exactly when the
    table marks the field ``launch``; its digest stays what it was (a state file's
    engines are adopted across ktd's upgrade, not restarted)."""
    a = kt_spec()
    b = kt_spec(
        alias="other",
        path="/m/other",
        backend="other",
        served=False,
        source="u",
        kt_weight_path="/w",
        host="127.0.0.2",
        port=9,
        ctx=8,
        extra_args=("--x",),
        extra_env=(("A", "1"),),
        python="/p",
        auto_build=True,
        tp_size=2,
        nnodes=2,
        dist_init_addr="h:1",
        numa=[0],
        gpus=[1],
        ttl=1.0,
        restart="no",
        pinned=True,
        swap=False,
        health_timeout=5.0,
        max_concurrent=1,
        max_queue=1,
        not_served_reason="r",
        fit="ignore",
        sleep=True,
        sleep_ttl=3.0,
        catalog="c",
    )
    for name in ModelSpec.__struct_fields__:
        assert getattr(a, name) != getattr(b, name), name
        changed = msgspec.structs.replace(a, **{name: getattr(b, name)})
        assert (changed.launch_key() != a.launch_key()) == (name in LAUNCH), name
    before = ("path", "kt_weight_path", "host", "port", "ctx", "extra_args", "extra_env")
    before += ("python", "tp_size", "nnodes", "dist_init_addr", "numa", "gpus", "sleep")
    assert before == LAUNCH_FIELDS  # launch_key's order, for the digests
    assert a.launch_digest() == "21aaed6bb1a932fe51252b076c3b9108c1311ab4"
    assert (
        b.launch_digest()
        == msgspec.structs.replace(a, **{n: getattr(b, n) for n in LAUNCH}).launch_digest()
    )
