"""The table of models.json's fields: every one is the schema's, each kind reads its
values, an unknown field or a wrong value names the field (issue 39)."""

from __future__ import annotations

import msgspec
import pytest

from ktd.core.config import KtOverrides, ModelEntry
from ktd.core.modelfields import FIELDS, FieldValueError, field, parse_value, readme_lines


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
