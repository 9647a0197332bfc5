"""``FIELD+=VALUE`` / ``FIELD-=VALUE`` of ``ktctl config set`` (``ktd.core.fieldops``, issue
43): one flag or variable added or taken out, where ``FIELD=VALUE`` replaces the whole."""

from __future__ import annotations

import pytest

from ktd.core import fieldops
from ktd.core.modelfields import FieldValueError

ARGS = "kt.extra_args"
FLAGS = ["--kt-method", "AMXINT4", "--kt-num-gpu-experts", "8", "--enable-metrics"]


def test_split_reads_the_three_ops() -> None:
    assert fieldops.split("ttl=600") == ("ttl", "=", "600")
    assert fieldops.split("kt.extra_args+=--kt-method=AMXINT4") == (
        ARGS, "+=", "--kt-method=AMXINT4",
    )  # fmt: skip
    assert fieldops.split("kt.extra_env-=FOO") == ("kt.extra_env", "-=", "FOO")
    with pytest.raises(FieldValueError, match="FIELD=VALUE, FIELD\\+=VALUE"):
        fieldops.split("ttl")


def test_only_lists_and_maps_take_plus_and_minus() -> None:
    fieldops.check(ARGS, "+=")
    fieldops.check("kt.extra_env", "-=")
    fieldops.check("ttl", "=")
    with pytest.raises(FieldValueError, match="ttl is set whole with ttl=VALUE"):
        fieldops.check("ttl", "+=")


def test_adding_flags_appends_them() -> None:
    assert fieldops.apply(ARGS, "+=", FLAGS, "--foo") == [*FLAGS, "--foo"]
    assert fieldops.apply(ARGS, "+=", FLAGS, "--kt-method=X") == [*FLAGS, "--kt-method=X"]
    assert fieldops.apply(ARGS, "+=", None, "'--tp-size 2'") == ["--tp-size 2"]
    assert fieldops.apply(ARGS, "+=", None, "--tp-size 2") == ["--tp-size", "2"]
    assert fieldops.apply(ARGS, "+=", [], '["--x", "1"]') == ["--x", "1"]
    with pytest.raises(FieldValueError, match="give the flag"):
        fieldops.apply(ARGS, "+=", FLAGS, "")


def test_removing_a_flag_takes_its_values_and_its_equals_form() -> None:
    assert fieldops.apply(ARGS, "-=", FLAGS, "--kt-method") == [
        "--kt-num-gpu-experts", "8", "--enable-metrics",
    ]  # fmt: skip
    assert fieldops.apply(ARGS, "-=", ["--a=1", "--b", "--a", "2"], "--a") == ["--b"]
    assert fieldops.apply(ARGS, "-=", FLAGS, "--kt-num-gpu-experts 8") == [
        "--kt-method", "AMXINT4", "--enable-metrics",
    ]  # fmt: skip
    assert fieldops.apply(ARGS, "-=", ["--x=1", "--y"], "--x=1") == ["--y"]
    with pytest.raises(FieldValueError, match=r"kt\.extra_args has no --nope; it is"):
        fieldops.apply(ARGS, "-=", FLAGS, "--nope")
    with pytest.raises(FieldValueError, match="has no --kt-method AMXINT5"):
        fieldops.apply(ARGS, "-=", FLAGS, "--kt-method AMXINT5")


def test_env_adds_and_removes_variables() -> None:
    env = {"A": "1", "B": "2"}
    assert fieldops.apply("kt.extra_env", "+=", env, "C=3 A=9") == {"A": "9", "B": "2", "C": "3"}
    assert fieldops.apply("kt.extra_env", "-=", env, "A") == {"B": "2"}
    assert fieldops.apply("kt.extra_env", "+=", None, "C=3") == {"C": "3"}
    with pytest.raises(FieldValueError, match=r"kt\.extra_env has no Z; it holds A, B"):
        fieldops.apply("kt.extra_env", "-=", env, "Z")


def test_equals_replaces() -> None:
    assert fieldops.apply(ARGS, "=", FLAGS, "--foo") == ["--foo"]
