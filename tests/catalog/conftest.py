"""The hub stand-in for the pull tests (``tests/hub/standin.py``), one per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.hub.standin import Repo, StandIn

MiB = 1 << 20


def tiny_repo(name: str = "org/tiny", size: int = 4 * MiB) -> Repo:
    """A config kept in git and one LFS safetensors file of ``size`` random bytes."""
    return Repo(
        name,
        {
            "config.json": b'{"architectures": ["TinyForCausalLM"]}\n',
            "model.safetensors": os.urandom(size),
        },
    )


@pytest.fixture
def hub() -> Iterator[StandIn]:
    standin = StandIn()
    standin.add(tiny_repo())
    with standin:
        yield standin
