"""The engine state machine (pure): states, legal moves, what each state allows, and phases.

``stopped → starting → ready → draining → stopping → stopped``, plus ``failed``,
and sleep: ``ready → sleeping → asleep → waking → ready`` (``asleep → stopping``).
Only an engine's own supervisor task moves it; a move not listed here is a bug,
so ``check`` raises instead of letting the pool drift from the processes.

States are a ``StrEnum``: they go on the wire and into the state file as their
plain names (``"ready"``), and compare equal to them, so scripts that read
``ktctl status --json`` see what they always saw.

A *phase* says which step of a state the engine is in. It is structured
(``Phase.step`` from a fixed set, plus the engines it names) so that programs act
on the step, never on its wording; ``Phase.text`` is for people.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ktd.protocol import EngineState

# The states are the wire's vocabulary (``ktd.protocol.EngineState``): defined there,
# so the protocol needs nothing of the core; this machine moves between them.
State = EngineState


STOPPED = State.STOPPED
STARTING = State.STARTING
READY = State.READY
DRAINING = State.DRAINING
STOPPING = State.STOPPING
FAILED = State.FAILED
SLEEPING = State.SLEEPING
ASLEEP = State.ASLEEP
WAKING = State.WAKING

ALL: tuple[State, ...] = tuple(State)

TRANSITIONS: dict[State, frozenset[State]] = {
    STOPPED: frozenset({STARTING, FAILED}),
    # starting → starting: a retry (port taken at bind, crash backoff).
    # starting → draining: an adopted engine (a previous daemon's) may be serving
    # streams before this daemon has seen it healthy; an evict then drains it too.
    STARTING: frozenset({STARTING, READY, DRAINING, STOPPING, FAILED, STOPPED}),
    # ready → starting: a crash restart under the restart policy.
    # starting → asleep: an adopted engine a previous daemon had put to sleep.
    READY: frozenset({DRAINING, STOPPING, STARTING, FAILED, STOPPED, SLEEPING}),
    DRAINING: frozenset({STOPPING}),
    STOPPING: frozenset({STOPPED, FAILED, STARTING}),
    FAILED: frozenset({STARTING, STOPPED}),
    # sleeping → ready: a request came back before the release (the sleep is called off).
    SLEEPING: frozenset({ASLEEP, READY, STOPPING, STOPPED, FAILED, STARTING}),
    ASLEEP: frozenset({WAKING, STOPPING, STOPPED, FAILED}),
    # waking → asleep: no room for it (busy holders), or put back before the resume.
    WAKING: frozenset({READY, ASLEEP, STOPPING, STOPPED, FAILED, SLEEPING, STARTING}),
}
TRANSITIONS[STARTING] = TRANSITIONS[STARTING] | {ASLEEP}

# States in which the engine holds its NUMA nodes' CPUs, its GPUs and a port: nobody
# else may be placed there. An asleep engine holds only host memory and its port. A
# waking one holds them only once its room is made (``holds``).
HOLDS_RESOURCES = frozenset({STARTING, READY, DRAINING, STOPPING, SLEEPING, WAKING})
# States in which processes may exist.
HAS_PROCESSES = HOLDS_RESOURCES | {ASLEEP}
# States on the way down (a reason given by whoever asked for the stop applies).
GOING_DOWN = frozenset({DRAINING, STOPPING, STOPPED})


def holds(state: State, step: str | None) -> bool:
    """Does an engine in ``state`` at phase ``step`` hold its NUMA nodes' CPUs and its
    GPUs now? A waking engine holds them from the moment its room is made (the placer
    moves it to ``resuming`` while it still has the placement lock) until it is asleep
    again; before that it is asleep in all but name, exactly as a starting engine holds
    nothing until it is placed. Counting a wake that is still making room as a holder
    made two wakes on one node each wait for the other to go idle, for ever."""
    if state == WAKING:
        return step in (Step.RESUMING, Step.CHECKING)
    return state in HOLDS_RESOURCES


class IllegalTransition(RuntimeError):
    pass


def check(old: State, new: State) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise IllegalTransition(f"engine state {old} -> {new} is not allowed")


class Step(StrEnum):
    """The steps a phase can name (``EngineInfo.step``; stable strings)."""

    PROBING = "probing"  # asking the engine's Python what SGLang it has
    INSTALLING = "installing"  # auto_build's pip install
    PREFLIGHT = "preflight"  # paths, imports, port, memory fit
    PLACING = "placing"
    WAITING = "waiting"  # for busy holders of its NUMA nodes/GPUs to go idle (a swap)
    MAKING_ROOM = "making_room"  # stopping idle holders, or putting them to sleep
    LOADING = "loading"  # the engine process runs and loads (log milestones refine the text)
    ADOPTING = "adopting"  # a previous daemon's engine, taken over
    RESTARTING = "restarting"  # crash backoff before the next launch
    DRAINING = "draining"  # requests in flight finish before the stop
    DEREGISTERING = "deregistering"  # off the gateway before the drain
    TERMINATING = "terminating"
    FENCING = "fencing"  # new requests held at SGLang's door, the engine proven idle (sleep)
    RELEASING = "releasing"  # SGLang releases its GPU memory (sleep)
    RESUMING = "resuming"  # SGLang takes its GPU memory back (wake)
    CHECKING = "checking"  # one generation after a resume, before ready


@dataclass(frozen=True)
class Phase:
    step: Step
    text: str
    engines: tuple[str, ...] = ()  # the holders waited for, or stopped to make room

    @classmethod
    def of(cls, step: Step, text: str | None = None, engines: tuple[str, ...] = ()) -> Phase:
        return cls(step, text or _TEXT[step].format(", ".join(engines)), engines)

    def waiting_for(self) -> tuple[str, ...]:
        """The engines a load waits for (a swap), else nothing."""
        return self.engines if self.step == Step.WAITING else ()


_TEXT = {
    Step.PROBING: "probing engine Python",
    Step.INSTALLING: "pip install",
    Step.PREFLIGHT: "preflight",
    Step.PLACING: "placing",
    Step.WAITING: "waiting for {}",
    Step.MAKING_ROOM: "stopping {} to make room",
    Step.LOADING: "loading",
    Step.ADOPTING: "adopting",
    Step.RESTARTING: "restarting",
    Step.DRAINING: "draining",
    Step.DEREGISTERING: "deregistering from the gateway",
    Step.TERMINATING: "terminating",
    Step.FENCING: "holding new requests, proving the engine idle",
    Step.RELEASING: "releasing GPU memory",
    Step.RESUMING: "resuming GPU memory",
    Step.CHECKING: "checking health after resume",
}


def making_room(stopping: Sequence[str], sleeping: Sequence[str] = ()) -> str:
    """The MAKING_ROOM phase's text: who is stopped and who is put to sleep (issue 43:
    it said "stopping" of an engine being put to sleep)."""
    parts = []
    if sleeping:
        parts.append(f"putting {', '.join(sleeping)} to sleep")
    if stopping:
        parts.append(f"stopping {', '.join(stopping)}")
    return " and ".join(parts) + " to make room"
