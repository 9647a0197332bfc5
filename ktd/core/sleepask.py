"""What ``ktctl sleep`` and ``ktctl wake`` are answered, from the engine's own account (pure).

The two requests only set a desire on the engine and wait: the engine's driver does the
drain, SGLang's release and its resume (``ktd.core.lifecycle``); whether to sleep at all
or stop instead is ``ktd.core.sleepcost``'s. What is left to the request is three rules
over what the engine says of itself (its sleep mode, its state, its desire, its reason):
may it be asked, when is the wait over, and what does the end mean. They are here, apart
from the waiting (``ktd.daemon.pool.controls``), so each answer is tested without an engine.
An answer that turns the request away is a ``Refusal``: the control API's error as data
(the daemon raises it as ``ControlError``, with its stable code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ktd.core import states as S
from ktd.core.lifecycle_io import Want
from ktd.protocol import ErrorCode

__all__ = [
    "SLEEPS_FROM",
    "WAKES_FROM",
    "Refusal",
    "asleep_already",
    "awake_already",
    "cannot_sleep",
    "sleep_end",
    "sleep_over",
    "sleep_refused",
    "wake_refused",
]

#: A running engine (or one on its way up or down between ready and asleep) can sleep.
SLEEPS_FROM = frozenset({S.READY, S.STARTING, S.WAKING, S.SLEEPING})
#: An asleep engine wakes (or one on its way there or back); other states are a load's.
WAKES_FROM = frozenset({S.ASLEEP, S.SLEEPING, S.WAKING})


@dataclass(frozen=True)
class Refusal:
    """A sleep or a wake turned away: its code (``ErrorCode``), a message for people and
    a detail map for programs."""

    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


def cannot_sleep(alias: str, mode: str, sglang: str | None) -> Refusal | None:
    """Why ``alias`` cannot sleep at all, by its sleep ``mode`` (``off``: not asked in its
    models.json entry; ``unsupported``: its SGLang, named ``sglang``, has no memory saver)."""
    if mode == "off":
        return Refusal(
            ErrorCode.NO_SLEEP,
            f'{alias} cannot sleep: its models.json entry has no "sleep": true',
            {"sleep": mode},
        )
    if mode == "unsupported":
        return Refusal(
            ErrorCode.NO_SLEEP,
            f"{alias} cannot sleep: {sglang or 'its SGLang'} has no --enable-memory-saver "
            "(install sglang-kt or SGLang >= 0.4.9); its swaps stop and reload",
            {"sleep": mode},
        )
    return None


def asleep_already(state: str, want_up: bool) -> bool:
    """A sleep asked of an engine asleep and wanted nowhere else is answered at once."""
    return state == S.ASLEEP and not want_up


def sleep_refused(alias: str, state: str) -> Refusal | None:
    """Only a running engine can be put to sleep (a stopped one has nothing to release)."""
    if state in SLEEPS_FROM:
        return None
    return Refusal(
        ErrorCode.NOT_LOADED,
        f"{alias} is {state}: only a running engine can sleep",
        {"state": state},
    )


def sleep_over(state: str, want: Want) -> bool:
    """The wait of a sleep ends when the engine is asleep or stopped, or when something
    else (a load, a wake, an evict) changed what is wanted of it."""
    return want != Want.ASLEEP or state in (S.ASLEEP, S.STOPPED, S.FAILED)


def sleep_end(alias: str, state: str, want: Want, reason: str | None) -> Refusal | None:
    """What a sleep whose wait is over is answered: nothing to say when asleep; a load or
    a wake that overtook it keeps the engine up (``busy``); otherwise it ended stopped,
    with the engine's reason when it gave one (the drain did not reach zero in time, no
    door, ...)."""
    if state == S.ASLEEP:
        return None
    if want == Want.UP:
        return Refusal(
            ErrorCode.BUSY,
            f"sleep of {alias} overtaken by a load or a wake: it stays up",
            {"state": state},
        )
    if state in (S.STOPPING, S.STOPPED, S.FAILED) and reason:
        why = reason
    else:
        why = "overtaken by an evict, a reload or ktd's shutdown: it stops"
    return Refusal(ErrorCode.LOAD_FAILED, f"sleep of {alias} ended: {why}", {"state": state})


def awake_already(state: str, want_up: bool) -> bool:
    """A wake asked of a ready engine that stays wanted up is answered at once."""
    return state == S.READY and want_up


def wake_refused(alias: str, state: str, no_sleep: Refusal | None) -> Refusal | None:
    """A wake of an engine that is not asleep (nor on its way there or back) is turned
    away: with ``no_sleep`` (``cannot_sleep``'s answer) when it cannot sleep at all, else
    with the load that would start it."""
    if state in WAKES_FROM:
        return None
    return no_sleep or Refusal(
        ErrorCode.NOT_LOADED,
        f"{alias} is {state}, not asleep: `ktctl load {alias}` loads it",
        {"state": state},
    )
