"""The restart policy alone: crash budget, backoff and retry delay, no process started."""

from __future__ import annotations

import pytest

from ktd.core.restart import BACKOFF_CAP, RETRY_CAP, GiveUp, Restart, RestartBudget, retry_delay


def crash(budget: RestartBudget, now: float, **kw: float) -> Restart | GiveUp:
    opts = {"window": 60.0, "max_crashes": 3, "backoff": 1.0, **kw}
    return budget.on_crash(
        now,
        "engine was killed by SIGKILL while ready",
        window=opts["window"],
        max_crashes=int(opts["max_crashes"]),
        backoff=opts["backoff"],
    )


def test_backoff_doubles_per_restart_and_is_capped() -> None:
    budget = RestartBudget()
    delays = [crash(budget, t * 1000.0, backoff=1.0) for t in range(9)]
    assert delays[:4] == [Restart(1.0), Restart(2.0), Restart(4.0), Restart(8.0)]
    assert delays[-1] == Restart(BACKOFF_CAP)


def test_too_many_crashes_within_the_window_give_up() -> None:
    budget = RestartBudget()
    assert [type(crash(budget, t)) for t in (0.0, 1.0, 2.0)] == [Restart] * 3
    step = crash(budget, 3.0)
    assert isinstance(step, GiveUp)
    assert step.reason.startswith("flapping: 4 crashes within 60s; last: engine was killed")


def test_crashes_older_than_the_window_do_not_count() -> None:
    budget = RestartBudget()
    for t in (0.0, 1.0, 2.0):
        crash(budget, t, window=10.0)
    assert isinstance(crash(budget, 20.0, window=10.0), Restart)
    assert len(budget.crashes) == 1


def test_a_new_load_starts_a_fresh_budget_and_backoff() -> None:
    budget = RestartBudget()
    for t in (0.0, 1.0, 2.0):
        crash(budget, t)
    budget.reset()
    assert crash(budget, 3.0) == Restart(1.0)


def test_max_crashes_zero_gives_up_at_the_first_crash() -> None:
    assert isinstance(crash(RestartBudget(), 0.0, max_crashes=0), GiveUp)


@pytest.mark.parametrize(
    ("failures", "backoff", "delay"),
    [(0, 2.0, 0.0), (1, 2.0, 2.0), (2, 2.0, 4.0), (3, 2.0, 8.0), (50, 2.0, RETRY_CAP)],
)
def test_retry_delay_after_failed_loads(failures: int, backoff: float, delay: float) -> None:
    assert retry_delay(failures, backoff) == delay


def test_retry_delay_with_negative_backoff_is_zero() -> None:
    assert retry_delay(3, -1.0) == 0.0
