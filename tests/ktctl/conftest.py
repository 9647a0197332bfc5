"""Fixtures for ktctl's unit tests."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ktctl.ktctl_fakes import FakeDaemon, Handler


@pytest.fixture
def rundir() -> Iterator[Path]:
    """A short private directory: AF_UNIX paths are limited to ~107 bytes."""
    with tempfile.TemporaryDirectory(prefix="ktctl-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def daemon(rundir: Path) -> Iterator[Callable[..., FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(handler: Handler, *, echo_ids: bool = False) -> FakeDaemon:
        d = FakeDaemon(rundir, handler, echo_ids=echo_ids)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()
