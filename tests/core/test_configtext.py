"""models.json edited as a person would edit it: only the changed value's text moves, in
the file's own layout; the rest of the file, byte for byte, stays (issue 39, item 5)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ktd.core import configtext as ct
from tests.hypo import budget

# The README's style: several members per line, two entries, no trailing comma games.
README = """[
  {"path": "/models/DeepSeek-V4", "backend": "kt", "alias": "deepseek-v4-kt",
   "kt": {"kt_weight_path": "/models/DeepSeek-V4-kt", "ctx": 65536},
   "numa": "auto", "gpus": "auto", "ttl": 0, "restart": "on-failure", "pinned": false},
  {"path": "/models/Qwen3", "backend": "ds4", "alias": "qwen3"}
]
"""


def dumped(entries: list[dict[str, Any]], indent: int | str = 2) -> str:
    return json.dumps(entries, indent=indent) + "\n"


def test_a_changed_value_is_the_only_change_in_the_readme_layout() -> None:
    out = ct.set_fields(README, "deepseek-v4-kt", {"kt.ctx": 8192})
    assert out == README.replace('"ctx": 65536', '"ctx": 8192')


def test_a_new_field_goes_last_in_its_object_in_the_style_of_its_siblings() -> None:
    out = ct.set_fields(README, "qwen3", {"ttl": 600})
    assert out == README.replace('"alias": "qwen3"}', '"alias": "qwen3", "ttl": 600}')
    # A new nested object: one line here, as its entry is.
    out = ct.set_fields(README, "qwen3", {"kt.ctx": 4096})
    assert '"alias": "qwen3", "kt": {"ctx": 4096}}' in out


def test_untouched_spellings_stay_as_written() -> None:
    text = '[\n    {"alias": "a", "path": "/p", "backend": "kt", "ttl": 600, "sleep_ttl": 1e3}\n]\n'
    out = ct.set_fields(text, "a", {"path": "/q"})
    # 600 is not re-dumped as 600.0, 1e3 not as 1000.0; four spaces stay four.
    assert out == text.replace('"/p"', '"/q"')


def test_one_member_per_line_files_keep_their_indent_and_new_members_line_up() -> None:
    entries = [
        {"path": "/a", "backend": "kt", "alias": "a", "kt": {"ctx": 4, "extra_args": ["--x"]}},
        {"path": "/b", "backend": "kt", "alias": "b"},
    ]
    for indent in (2, 4, "\t"):
        text = dumped(entries, indent)
        out = ct.set_fields(text, "a", {"kt.python": "/venv/bin/python", "ttl": 30})
        unit = indent if isinstance(indent, str) else " " * indent
        assert json.loads(out)[0]["kt"]["python"] == "/venv/bin/python"
        assert f'\n{unit * 3}"python": "/venv/bin/python"\n{unit * 2}}}' in out
        assert f'\n{unit * 2}"ttl": 30\n{unit}}}' in out
        assert out.endswith(text[text.index("{\n" + unit * 2 + '"path": "/b"') - 1 :])


def test_unset_removes_only_that_member() -> None:
    text = dumped([{"path": "/a", "backend": "kt", "alias": "a", "ttl": 600, "fit": "ignore"}])
    out = ct.set_fields(text, "a", {}, unset=["ttl"])
    assert json.loads(out) == [{"path": "/a", "backend": "kt", "alias": "a", "fit": "ignore"}]
    assert out == text.replace('    "ttl": 600,\n', "")
    # Unsetting a field under an object the entry does not have adds nothing.
    assert ct.set_fields(text, "a", {}, unset=["kt.ctx"]) == text


def test_add_and_remove_entries_keep_the_rest() -> None:
    added = ct.add_entry(README, {"path": "/m/x", "backend": "kt", "alias": "x"})
    assert added == README.replace(
        '"alias": "qwen3"}\n',
        '"alias": "qwen3"},\n  {"path": "/m/x", "backend": "kt", "alias": "x"}\n',
    )
    assert ct.remove_entry(added, "x") == README
    removed = ct.remove_entry(README, "deepseek-v4-kt")
    assert json.loads(removed) == [{"path": "/models/Qwen3", "backend": "ds4", "alias": "qwen3"}]
    assert removed.endswith('  {"path": "/models/Qwen3", "backend": "ds4", "alias": "qwen3"}\n]\n')
    assert ct.remove_entry(removed, "qwen3") == "[]\n"
    assert json.loads(ct.add_entry("[]\n", {"alias": "z"})) == [{"alias": "z"}]
    assert json.loads(ct.add_entry(None, {"alias": "z"})) == [{"alias": "z"}]


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(ct.EditError, match=r"no entry with alias 'nope'.*deepseek-v4-kt, qwen3"):
        ct.set_fields(README, "nope", {"ttl": 1})
    with pytest.raises(ct.EditError, match="not valid JSON"):
        ct.set_fields("[{", "a", {"ttl": 1})
    with pytest.raises(ct.EditError, match="not a JSON list"):
        ct.entries('{"models": []}')
    text = dumped([{"path": "/a", "backend": "kt", "alias": "a", "kt": "oops"}])
    with pytest.raises(ct.EditError, match=r"kt\.ctx: kt is not an object"):
        ct.set_fields(text, "a", {"kt.ctx": 1})


def test_version_ids_follow_the_bytes() -> None:
    a = ct.version_of(b"{}", "/etc/models.json", b"[]")
    assert a == ct.version_of(b"{}", "/etc/models.json", b"[]")
    assert len({a, ct.version_of(b"{} ", "/etc/models.json", b"[]"),
                ct.version_of(b"{}", "/etc/other.json", b"[]"),
                ct.version_of(b"{}", "/etc/models.json", None)}) == 4  # fmt: skip


# ---------------------------------------------------------------- properties

_scalar = st.one_of(
    st.integers(-1000, 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3),
    ),
    max_leaves=6,
)
_entry = st.dictionaries(
    st.sampled_from(["path", "backend", "ttl", "numa", "gpus", "kt", "fit", "sleep"]),
    _value,
    max_size=5,
)


@budget(150, deadline=None)
@given(
    st.lists(_entry, min_size=1, max_size=4),
    st.sampled_from([None, 2, 4, "\t"]),
    st.data(),
)
def test_any_edit_yields_exactly_the_edited_document(
    raw: list[dict[str, Any]], indent: int | str | None, data: st.DataObject
) -> None:
    """Whatever the layout and values: the text after an edit parses to the document
    with that edit made, and every other entry's text is what it was."""
    entries = [{"alias": f"m{i}", **e} for i, e in enumerate(raw)]
    text = json.dumps(entries, indent=indent) + "\n"
    target = data.draw(st.integers(0, len(entries) - 1))
    field = data.draw(st.sampled_from(["ttl", "numa", "kt.ctx", "kt.extra_args", "pinned"]))
    value = data.draw(_value)
    expected = json.loads(json.dumps(entries))
    holder = expected[target]
    if field.startswith("kt."):
        if holder.get("kt") is None:
            holder["kt"] = {}  # made (a null taken for "not there")
        if not isinstance(holder["kt"], dict):
            with pytest.raises(ct.EditError):
                ct.set_fields(text, f"m{target}", {field: value})
            return
        holder = holder["kt"]
    holder[field.split(".")[-1]] = value
    out = ct.set_fields(text, f"m{target}", {field: value})
    assert json.loads(out) == expected
    untouched = [json.dumps(e, indent=indent) for i, e in enumerate(entries) if i != target]
    if indent is not None:
        for piece in untouched:
            shifted = piece.replace(
                "\n", "\n" + (indent if isinstance(indent, str) else " " * indent)
            )
            assert shifted in out


def test_a_number_sent_back_as_the_same_number_keeps_its_spelling() -> None:
    text = '[{"alias": "a", "ttl": 600.0, "pinned": false, "max_queue": 1}]\n'
    index = ct.find_entry(text, "a")
    # What a page's JavaScript sends back for an untouched form: 600, not 600.0.
    same = {"alias": "a", "ttl": 600, "pinned": False, "max_queue": 1}
    assert ct.replace_entry(text, index, same) == text
    assert '"pinned": true' in ct.replace_entry(text, index, {**same, "pinned": True})
    assert '"max_queue": true' in ct.replace_entry(text, index, {**same, "max_queue": True})
