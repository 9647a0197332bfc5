"""The catalog's files: the built-in one loads whole; a bad operator file is reported with
its file and the field, and everything else still loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktd.catalog.load import BUILTIN, load, merge
from ktd.catalog.schema import FORMAT

TINY = Path(__file__).with_name("tiny.json")


def entry(**over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "name": "mine",
        "family": "test",
        "sources": [{"role": "model", "repo": "me/mine"}],
        "variants": [{"name": "plain"}],
    }
    e.update(over)
    return e


def write(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_the_builtin_catalog_loads_whole_and_every_fact_has_a_source() -> None:
    cat = load()
    assert cat.problems == ()
    names = {e.name for e in cat.entries}
    assert {"deepseek-v4-flash", "deepseek-v3-0324", "deepseek-r1-0528", "deepseek-v3.2"} <= names
    assert {
        "kimi-k2-thinking",
        "kimi-k2-instruct",
        "qwen3-30b-a3b",
        "glm-5",
        "minimax-m2.1",
    } <= names
    assert cat.find("deepseek-v4-kt") is cat.find("DeepSeek-V4-Flash") is not None
    for e in cat.entries:
        assert e.refs, e.name
        for s in e.sources:
            assert s.refs, (e.name, s.repo)
            # No commit is sourced for these repositories: unknown, and said so (never invented).
            assert s.revision is None and "resolves" in s.note, (e.name, s.repo)
        for v in e.variants:
            assert v.refs, (e.name, v.name)
        for value, what in ((e.needs.disk_gb, "disk"), (e.needs.host_ram_gb, "RAM")):
            assert value is None or e.needs.refs, (e.name, what)


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ("{not json", "$", "not JSON"),
        ({"catalog": 2, "models": []}, "$.catalog", f"format {FORMAT}"),
        ({"catalog": 1, "models": [entry(famly="x")]}, "$.models[0]", "famly"),
        ({"catalog": 1, "models": [entry(family=3)]}, "$.models[0].family", "Expected `str`"),
        (
            {"catalog": 1, "models": [entry(variants=[{"name": "v", "kt_metod": "FP8"}])]},
            "$.models[0].variants[0]",
            "kt_metod",
        ),
        (
            {
                "catalog": 1,
                "models": [entry(sources=[{"role": "model", "repo": "me/m", "revision": "abc"}])],
            },
            "$.models[0].sources[0].revision",
            "matching regex",
        ),
        (
            {
                "catalog": 1,
                "models": [
                    entry(variants=[{"name": "v", "kt_method": "AMXINT4", "weights": "kt-weights"}])
                ],
            },
            "$.models[0].variants[0].weights",
            "no such source is for AMXINT4",
        ),
        ({"catalog": 1, "models": [entry(variants=[])]}, "$.models[0].variants", "no variant"),
    ],
)
def test_a_bad_file_names_file_and_field_and_the_builtin_still_loads(
    tmp_path: Path, doc: Any, field: str, words: str
) -> None:
    bad = write(tmp_path, "bad.json", doc)
    cat = load([bad])
    [problem] = cat.problems
    assert problem.file == str(bad)
    assert problem.field == field
    assert words in problem.message
    assert cat.find("deepseek-v4-kt") is not None  # the built-in catalog still works
    assert cat.find("mine") is None


def test_one_bad_entry_leaves_the_others_of_its_file(tmp_path: Path) -> None:
    doc = {"catalog": 1, "models": [entry(variants=[]), entry(name="good")]}
    cat = load([write(tmp_path, "two.json", doc)])
    assert [p.field for p in cat.problems] == ["$.models[0].variants"]
    assert cat.find("good") is not None


def test_a_missing_file_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    cat = load(["nowhere.json"], base=tmp_path)
    [problem] = cat.problems
    assert problem.file == str(tmp_path / "nowhere.json") and "cannot be read" in problem.message
    assert cat.entries


def test_an_operator_entry_replaces_the_builtin_one_and_a_stolen_alias_is_dropped(
    tmp_path: Path,
) -> None:
    mine = entry(name="deepseek-v4-flash", aliases=["my-v4"])
    thief = entry(name="other", aliases=["deepseek-r1", "fine"])
    cat = load([write(tmp_path, "a.json", {"catalog": 1, "models": [mine, thief]})])
    assert cat.find("deepseek-v4-flash") is not None
    assert cat.find("deepseek-v4-flash").sources[0].repo == "me/mine"  # type: ignore[union-attr]
    assert cat.origin["deepseek-v4-flash"] == str(tmp_path / "a.json")
    assert any("replaces the entry of builtin.json" in n for n in cat.notes)
    [p] = cat.problems
    assert p.field == "other.aliases[0]" and "already names deepseek-r1-0528" in p.message
    assert cat.find("fine").name == "other"  # type: ignore[union-attr]


def test_the_tests_own_catalog_holds_the_tiny_model() -> None:
    cat = merge([(BUILTIN, b'{"catalog": 1, "models": []}'), (str(TINY), TINY.read_bytes())])
    assert cat.problems == ()
    tiny = cat.find("tiny-qwen2")
    assert tiny is not None and tiny.variants[0].kt_method is None
