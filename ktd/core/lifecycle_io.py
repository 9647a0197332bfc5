"""The lifecycle machine's words (``ktd.core.lifecycle``): what it is told and what it answers.

Its inputs are one ``Look`` at a time under the ``Settings`` it decides with, and the
reports of the actions it answered; each action names the report its driver
(``ktd.daemon.engine.supervisor``) gives back. Kept apart from the machine so that the
driver's side reads as a list; ``ktd.core.lifecycle`` re-exports every name.

Sleep is SGLang's memory API (``docs/sglang.md``, "Sleep"): ``/release_memory_occupation``
frees the engine's GPU memory, ``/resume_memory_occupation`` takes it back; the kt
experts stay in host RAM throughout. SGLang asserts that nothing runs when it
releases (a release with a request in flight takes the server down), and a released
server would still run a generation sent to it, on freed memory. So:

* a release is asked only once the engine is drained to zero and fenced: nobody holds it
  (ktd's leases and the frontends' claims, which were recalled first) and its own
  ``/v1/loads`` counts nothing, read after the last holder left; then SGLang's door is
  closed (``/pause_generation`` in ``abort`` mode: every new generation, ``/health``'s
  included, waits in the tokenizer; what ktd could not see is aborted) and the engine
  proves itself idle: ``/flush_cache`` succeeds (the scheduler answers it after
  everything sent before) and a ``/v1/loads`` reading taken after the door closed counts
  nothing. One zero reading is no proof: ``/v1/loads`` misses a request while it is
  tokenized and in its first prefill (``ktd.core.loads``). An SGLang without the pause
  route gets the best ktd can do without it: zero readings for longer than SGLang's
  republish interval;
* from the release on, nothing that generates is sent (no ``/health`` probe, which
  generates a token) until the resume has answered and the door is open again; then one
  readiness check;
* an asleep engine is stopped without a wake, and a dead one is never woken; one whose
  memory ktd cannot know (a restart of ktd between the fence and the record of the
  release) is stopped and loaded afresh when wanted, never resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ktd.core.action import MachineAction
from ktd.core.exits import Outcome

__all__ = [
    "LOAD_POLL",
    "Action",
    "CheckHealth",
    "CheckLoad",
    "Continue",
    "Deregister",
    "Flush",
    "Idle",
    "Kill",
    "Launch",
    "Look",
    "MakeRoom",
    "Pause",
    "ReleaseMemory",
    "Resume",
    "Settings",
    "Wait",
    "Want",
]

#: Seconds between two reads of the engine's ``/v1/loads`` while it drains, and between
#: two readiness checks after a resume.
LOAD_POLL = 0.2


class Want(StrEnum):
    """What the engine's users want of it (set by anyone; read only by the machine)."""

    UP = "up"
    DOWN = "down"
    ASLEEP = "asleep"


@dataclass(frozen=True)
class Settings:
    """The daemon's and the model's bounds the machine decides with."""

    stop_grace: float = 30.0
    drain_timeout: float = 60.0
    hang_timeout: float = 60.0
    health_timeout: float = 1800.0  # the model's (the deadline itself comes with launched)
    memory_timeout: float = 120.0
    restart: bool = True  # the model's restart policy is on-failure
    restart_backoff: float = 2.0
    restart_max: int = 5
    restart_window: float = 600.0
    drain_engine: bool = False  # a stop waits for /v1/loads too (the gateway routes to it)


@dataclass(frozen=True)
class Look:
    """One observation. ``held``: leases and claims on the engine (someone may still send
    it requests). ``exited``: the process's exit, classified by the driver (with
    ``Lifecycle.was_ready``); None while it runs. ``drain``: the evict's own drain
    budget, else the daemon's."""

    now: float
    want: Want
    force: bool = False
    held: int = 0
    healthy: bool = False  # a starting engine answered as ready
    hung: bool = False  # a ready engine stopped answering /health for hang_timeout
    exited: Outcome | None = None
    drain: float | None = None


# ---------------------------------------------------------------- actions


class Idle(MachineAction):
    """No process and nothing wanted: wait for a change of want."""


class Wait(MachineAction):
    """Look again at ``until`` at the latest (or at any change)."""

    until: float


class Launch(MachineAction):
    """The launch pipeline: probe, preflight, place, spawn. Report with ``launched``."""


class Deregister(MachineAction):
    """Stop the traffic: recall the frontends' claims, leave the gateway. Report with
    ``deregistered``."""


class CheckLoad(MachineAction):
    """Read the engine's ``/v1/loads``. Report with ``load``."""


class Pause(MachineAction):
    """Close SGLang's door: ``POST /pause_generation`` in ``abort`` mode, bounded by
    ``memory_timeout`` and the drain's budget (``until``). Report with ``paused``."""

    until: float


class Flush(MachineAction):
    """``POST /flush_cache`` (bounded like ``Pause``): succeeds only on an idle
    scheduler. Report with ``flushed``."""

    until: float


class Continue(MachineAction):
    """Open SGLang's door again after a resume: ``POST /continue_generation``. Report
    with ``continued``."""


class ReleaseMemory(MachineAction):
    """``POST /release_memory_occupation`` (bounded by ``memory_timeout``). Report with
    ``released``."""


class MakeRoom(MachineAction):
    """Free the engine's own CPUs and GPUs of awake engines (a wake's swap). Report with
    ``room``."""


class Resume(MachineAction):
    """``POST /resume_memory_occupation`` (bounded). Report with ``resumed``."""


class CheckHealth(MachineAction):
    """One readiness check (``/v1/models`` and a ``/health`` generation). Report with
    ``checked``."""


class Kill(MachineAction):
    """The stop sequence with ``grace`` (``ktd.core.stop``). Report with ``killed``."""

    grace: float


Action = (
    Idle
    | Wait
    | Launch
    | Deregister
    | CheckLoad
    | Pause
    | Flush
    | ReleaseMemory
    | MakeRoom
    | Resume
    | Continue
    | CheckHealth
    | Kill
)
