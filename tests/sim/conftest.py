"""The ``sim_factory`` fixture: sims started by a test are killed when it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.simharness import SimProc, start_sim


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[Callable[..., SimProc]]:
    started: list[SimProc] = []

    def factory(**kwargs: Any) -> SimProc:
        sim = start_sim(tmp_path, **kwargs)
        started.append(sim)
        return sim

    try:
        yield factory
    finally:
        for sim in started:
            sim.kill()
