"""The hypothesis profiles (``tests/hypo.py``): the main suite's budgets are the tests' own."""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.hypo import budget


@pytest.fixture
def profile(request: pytest.FixtureRequest) -> object:
    """Load a profile for the test; the run's own is loaded back after it."""
    chosen = request.config.getoption("hypothesis_profile", None) or "ci"
    yield settings.load_profile
    settings.load_profile(chosen)


def test_ci_keeps_every_budget_and_dev_takes_a_tenth(profile: object) -> None:
    settings.load_profile("ci")
    assert budget(400, stateful_step_count=50).max_examples == 400
    assert budget(400, stateful_step_count=50).stateful_step_count == 50
    assert budget(7).max_examples == 7
    settings.load_profile("dev")
    assert budget(400, stateful_step_count=50).max_examples == 40
    assert budget(400, stateful_step_count=50).stateful_step_count == 50  # steps are kept
    assert budget(3).max_examples == 1  # never none


def test_the_main_suite_runs_each_machine_at_its_own_budget(
    request: pytest.FixtureRequest,
) -> None:
    """No silent reduction: without ``--hypothesis-profile`` (the README's command, CI) a
    state machine runs the examples its module states; only a chosen profile scales it."""
    from tests.core.test_admission import TestGate

    chosen = request.config.getoption("hypothesis_profile", None)
    full = chosen in (None, "ci")
    share = 1.0 if full else settings.get_profile(chosen).max_examples / 100
    assert TestGate.settings.max_examples == max(1, round(400 * share))
    assert TestGate.settings.stateful_step_count == 50
