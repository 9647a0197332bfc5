"""Every pure machine's actions are ``MachineAction``s (``ktd.core.action``).

A machine's answers are a union of records at the top of its module (``Action``,
``DeskAction``, ``Step``...): the test finds every union of dataclasses in ``ktd.core``
and checks that each member is a ``MachineAction``, so a new machine cannot write its
actions' dataclass boilerplate again, and one written the old way is named here.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import types
import typing
from collections.abc import Iterator

import pytest

import ktd.core
from ktd.core.action import MachineAction


def _unions() -> Iterator[tuple[str, str, tuple[type, ...]]]:
    """(module, name, members) for each union of dataclasses a core module defines."""
    for info in pkgutil.iter_modules(ktd.core.__path__):
        module = importlib.import_module(f"ktd.core.{info.name}")
        for name, value in vars(module).items():
            if not isinstance(value, types.UnionType):
                continue
            members = typing.get_args(value)
            own = [m for m in members if getattr(m, "__module__", None) == module.__name__]
            if own and all(dataclasses.is_dataclass(m) for m in members):
                yield module.__name__, name, tuple(own)


UNIONS = sorted(_unions())


def test_the_machines_are_found() -> None:
    found = {module for module, _, _ in UNIONS}
    assert {
        "ktd.core.stop",
        "ktd.core.lifecycle_io",
        "ktd.core.desk",
        "ktd.core.gate",
        "ktd.core.eviction",
    } <= found


@pytest.mark.parametrize(
    ("module", "members"),
    [(m, members) for m, _, members in UNIONS],
    ids=[f"{m}.{name}" for m, name, _ in UNIONS],
)
def test_actions_are_machine_actions(module: str, members: tuple[type, ...]) -> None:
    plain = [m.__name__ for m in members if not issubclass(m, MachineAction)]
    assert not plain, f"{module}: derive {plain} from ktd.core.action.MachineAction"
