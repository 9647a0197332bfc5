"""What every pure machine answers with: ``MachineAction``, an immutable record.

A machine in ``ktd.core`` (the stop, the lifecycle, the desk, the TTL, a pull job...)
is fed events and the clock and answers with actions that its trio driver carries
out. Every such action is the same kind of thing: a frozen value with its fields,
compared by value (the model tests compare the sequences a machine answers), hashable,
with the dataclass ``repr`` that logs and failing tests show. That is said once, here:
a subclass is made a frozen dataclass as it is defined (``dataclass_transform`` tells
the type checker so), and its body is only its docstring and its fields. A machine's
answers are one union of them (``Action = Kill | Wait | ...``);
``tests/core/test_action.py`` checks that every such union in ``ktd.core`` is made of
``MachineAction``s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, dataclass_transform

__all__ = ["MachineAction"]


@dataclass_transform(frozen_default=True)
class MachineAction:
    """The base of every machine's actions: each subclass is a frozen dataclass."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True)(cls)
