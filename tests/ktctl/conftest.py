"""Fixtures for ktctl's unit tests."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ktd import protocol as p
from tests.ktctl.ktctl_fakes import Answer, FakeDaemon, Handler


@pytest.fixture
def rundir() -> Iterator[Path]:
    """A short private directory: AF_UNIX paths are limited to ~107 bytes."""
    with tempfile.TemporaryDirectory(prefix="ktctl-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def fake_daemon(rundir: Path) -> Iterator[Callable[..., FakeDaemon]]:
    """Start fake daemons (two-argument handlers), closed at the test's end."""
    started: list[FakeDaemon] = []

    def start(handler: Handler, *, echo_ids: bool = False) -> FakeDaemon:
        d = FakeDaemon(rundir, handler, echo_ids=echo_ids)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


@pytest.fixture
def daemon(
    fake_daemon: Callable[..., FakeDaemon],
) -> Callable[[Callable[[p.Request], Answer]], FakeDaemon]:
    """The CLI tests' fake: one-argument handlers whose replies get the request's id."""

    def start(handler: Callable[[p.Request], Answer]) -> FakeDaemon:
        return fake_daemon(lambda req, _d: handler(req), echo_ids=True)

    return start


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ktctl setting of the environment the tests run in reaches them."""
    for var in ("KTD_SOCKET", "KTCTL_TIMEOUT", "KTCTL_DEBUG"):
        monkeypatch.delenv(var, raising=False)
