"""The plan's error answer, built once (issue 45): ``plan_refusal`` is what the daemon
raises for a refused apply and what ktctl says for a plan it will not apply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.daemon.config.desk import ConfigDesk
from ktd.protocol_config import plan_refusal


def _plan(*problems: p.ConfigProblem) -> p.ConfigPlanView:
    ok = not any(q.level == "error" for q in problems)
    return p.ConfigPlanView(base="a", version="b", problems=list(problems), ok=ok)


BUSY = p.ConfigProblem(level="error", code=p.ErrorCode.BUSY, alias="a", message="a is loading")
STALE = p.ConfigProblem(level="error", code=p.ErrorCode.STALE_CONFIG, message="changed since")
BAD = p.ConfigProblem(level="error", file="m.json", path="$[0].ttl", message="must be >= 0")
WARN = p.ConfigProblem(level="warning", message="would not fit now")


@pytest.mark.parametrize(
    ("problems", "code", "message"),
    [
        ((BAD,), "config_error", "m.json: $[0].ttl: must be >= 0; nothing was changed"),
        ((WARN, BUSY), "busy", "a is loading; nothing was changed"),
        ((STALE, BUSY), "stale_config", "changed since (and 1 more); nothing was changed"),
        # the config's own error first, whatever came before it
        ((BUSY, BAD), "config_error", "m.json: $[0].ttl: must be >= 0 (and 1 more); nothing"),
        ((WARN,), "config_error", "the plan was refused; nothing was changed"),
    ],
)
def test_the_refusal_names_the_configs_own_error_first(
    problems: tuple[p.ConfigProblem, ...], code: str, message: str
) -> None:
    got_code, got_message, _ = plan_refusal(_plan(*problems))
    assert (got_code, got_message[: len(message)]) == (code, message)


_problems = st.lists(
    st.builds(
        p.ConfigProblem,
        level=st.sampled_from(["error", "warning"]),
        message=st.text(max_size=8),
        file=st.sampled_from(["", "c.json", "m.json"]),
        path=st.sampled_from(["", "$.x", "$[1].kt.ctx"]),
        code=st.sampled_from(["", p.ErrorCode.BUSY, p.ErrorCode.STALE_CONFIG]),
    ),
    max_size=5,
).filter(lambda qs: any(q.level == "error" for q in qs))


@given(_problems)
def test_the_daemon_answers_with_the_one_refusal(problems: list[p.ConfigProblem]) -> None:
    plan = _plan(*problems)
    code, message, first = plan_refusal(plan)
    with pytest.raises(ControlError) as got:
        ConfigDesk._refuse(plan)
    assert (got.value.code, got.value.message) == (code, message)
    assert first is not None
    assert (got.value.detail["file"], got.value.detail["path"]) == (first.file, first.path)
