"""A pull's models.json entry into the user's models.json: added when the alias is
new; merged with the user's values and flags winning when it is not."""

from __future__ import annotations

from typing import Any

from ktd.catalog.entrymerge import merge_entry

PULLED: dict[str, Any] = {
    "path": "/models/org--m/main",
    "backend": "kt",
    "alias": "m",
    "kt": {
        "kt_weight_path": "/models/org--m/main",
        "extra_args": ["--kt-method", "MXFP4", "--kt-num-gpu-experts", "23", "--enable-x"],
    },
}


def test_a_new_alias_is_added() -> None:
    other = {"path": "/x", "backend": "kt", "alias": "other"}
    out, how, notes, alias = merge_entry([other], PULLED)
    assert alias == "m" and how == "added" and out == [other, PULLED] and notes == []


def test_a_users_flag_wins_and_the_rest_is_filled_in() -> None:
    mine = {
        "path": "/models/org--m/main",
        "backend": "kt",
        "alias": "m",
        "numa": [1],
        "kt": {"extra_args": ["--kt-num-gpu-experts", "12"], "ctx": 8192},
    }
    out, how, notes, _ = merge_entry([mine], PULLED)
    assert how == "merged"
    [got] = out
    assert got["numa"] == [1] and got["kt"]["ctx"] == 8192
    assert got["kt"]["kt_weight_path"] == "/models/org--m/main"
    assert got["kt"]["extra_args"] == [
        "--kt-num-gpu-experts", "12", "--kt-method", "MXFP4", "--enable-x",
    ]  # fmt: skip
    assert notes == ["your --kt-num-gpu-experts 12 kept (the pull's: 23)"]
    assert mine["kt"]["extra_args"] == ["--kt-num-gpu-experts", "12"]  # not mutated


def test_a_users_own_path_is_kept_and_said() -> None:
    mine = {"path": "/srv/my-m", "backend": "kt", "alias": "m", "kt": {"extra_args": "--enable-x"}}
    out, how, notes, _ = merge_entry([mine], PULLED)
    [got] = out
    assert got["path"] == "/srv/my-m" and how == "merged"
    assert got["kt"]["extra_args"] == "--enable-x --kt-method MXFP4 --kt-num-gpu-experts 23"
    assert notes == ["your path /srv/my-m kept; the pull is in /models/org--m/main"]


def test_the_same_entry_again_is_unchanged() -> None:
    out, how, _, _ = merge_entry([PULLED], PULLED)
    assert how == "unchanged" and out == [PULLED]


def test_a_pull_by_another_name_of_a_model_merges_into_it() -> None:
    mine = {**PULLED, "alias": "m-kt"}
    out, how, _, alias = merge_entry([mine], {**PULLED, "alias": "m"}, ["m-entry", "m-kt"])
    assert (how, alias, out) == ("unchanged", "m-kt", [mine])  # not added twice
