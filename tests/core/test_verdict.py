"""``ktd.core.verdict``: a named check's ``Verdicts`` give ``Check``s under its name."""

from __future__ import annotations

from ktd.core.verdict import Check, Verdicts


def test_each_verdict_carries_the_checks_name() -> None:
    v = Verdicts("m.ctx")
    assert v.ok("4096") == Check("m.ctx", "ok", "4096")
    assert v.warn("too long", "check it") == Check("m.ctx", "warn", "too long", "check it")
    assert v.fail("negative", "set ctx >= 0") == Check("m.ctx", "fail", "negative", "set ctx >= 0")


def test_an_ok_verdict_has_no_advice() -> None:
    assert Verdicts("python").ok("/usr/bin/python3").advice == ""
