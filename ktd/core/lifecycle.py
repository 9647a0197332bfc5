"""One engine's lifecycle (pure): launch, readiness, hang, drain, stop, restart, sleep, wake.

The engine's supervisor (``ktd.daemon.engine.supervisor``) feeds this machine what it
observes (``Look``: the clock, what is wanted of the engine, who holds it, its
health, its exit) and the results of the actions it carried out, and does the one
action the machine answers, as ``ktd.daemon.engine.kill`` does for ``ktd.core.stop``.
Every decision over time lives here: the readiness deadline, the hang kill, the
drain and its one budget, the crash restart loop, and sleep.

Sleep is SGLang's memory API (``docs/sglang.md``, "Sleep"); why its actions come
in the order this machine asks them is told with them, in ``ktd.core.lifecycle_io``.

A drain has one budget (``drain_timeout``, or the evict's own) shared by the gateway's
deregistration and the wait for holders and the engine's load. A sleep whose drain
does not reach zero within it stops the engine instead (the swap that asked still
gets its room); so does a release or a resume that fails or times out: the next
request loads it afresh. The machine's table is in ``docs/architecture.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from ktd.core import states as S
from ktd.core.exits import RETRIED, Outcome
from ktd.core.lifecycle_io import *  # noqa: F403  (the machine's words are its names too)
from ktd.core.lifecycle_io import (
    LOAD_POLL,
    Action,
    CheckHealth,
    CheckLoad,
    Continue,
    Deregister,
    Flush,
    Idle,
    Kill,
    Launch,
    Look,
    MakeRoom,
    Pause,
    ReleaseMemory,
    Resume,
    Settings,
    Wait,
    Want,
)
from ktd.core.loads import EngineLoad
from ktd.core.restart import GiveUp, RestartBudget
from ktd.core.sleepcost import REPUBLISH as REPUBLISH  # re-exported: the drivers' names
from ktd.core.sleepcost import Fence as Fence  # the fence's kinds; sleep or reload
from ktd.core.states import Phase, State, Step
from ktd.protocol import ErrorCode


class _End(StrEnum):
    """How a run that is being killed ends."""

    STOPPED = "stopped"  # asked for: stopped
    FAILED = "failed"  # a failed load: failed (backoff before a request retries)
    CRASHED = "crashed"  # restart per policy
    RETRY = "retry"  # a port taken, or out of GPU memory (exits.RETRIED): again, once
    DROPPED = "dropped"  # stopped, and the attempt that wanted it failed (sleep, wake)
    RELOAD = "reload"  # stopped to be loaded afresh at once (memory ktd cannot know)


@dataclass
class Lifecycle:
    """One engine, across its runs. ``state``, ``phase``, ``reason`` and ``error_code``
    are what the driver shows; only this machine moves them."""

    settings: Settings = field(default_factory=Settings)
    sleeps: bool = False  # its SGLang runs with the memory saver (set at launch/adoption)
    state: State = S.STOPPED
    phase: Phase | None = None
    reason: str | None = None
    error_code: str | None = None  # why the last attempt ended, for its waiters
    down_reason: str | None = None  # why it is wanted down (the driver sets it)
    running: bool = False  # a process of this run exists
    ready_seen: bool = False  # this run was ready once (an exit is then a crash)
    adopted: bool = False  # this run is a previous daemon's
    memory_released: bool = False  # from the release call until the resume answered
    memory_unknown: bool = False  # adopted between the fence and the release's record
    door_closed: bool = False  # SGLang holds new requests: a resume must open the door
    fence: Fence | None = None  # how far this sleep's fence got
    barrier: float = 0.0  # wall clock when SGLang's door closed (the pause's answer)
    flush: bool | None = None  # None: not asked yet; False: asked, not idle yet; True: idle
    flush_at: float | None = None  # when /flush_cache was last asked
    quiet_since: float | None = None  # the first of the zero readings in a row
    budget: RestartBudget = field(default_factory=RestartBudget)
    deadline: float = math.inf  # starting: healthy by then; waking: ready by then
    backoff_until: float | None = None  # a crash restart waits until then
    port_retries: int = 1
    # The way down: where to (DRAINING for a stop, SLEEPING for a sleep) and its progress.
    going: State | None = None
    drain_until: float = math.inf
    off_traffic: bool = False  # Deregister has been carried out
    unconfirmed: bool = False  # a router did not confirm the deregistration
    load_read: float | None = None  # when /v1/loads (or a check) was last read
    engine_load: EngineLoad | None = None  # what it counted then (None: unknown)
    # What the attempt's end makes of the want (the driver applies it and clears it): a
    # failed, refused or dropped attempt, or an exit nobody asked for, is not retried
    # until someone asks again; a wake that found no room leaves the engine asleep.
    settle_want: Want | None = None
    note: str | None = None  # a line for the engine's log (the driver writes it, clears it)
    _end: tuple[_End, str | None] | None = None  # set when a kill is decided

    # ------------------------------------------------------------ queries

    @property
    def was_ready(self) -> bool:
        """For exit classification: an exit now is a crash, not a failed load."""
        return self.ready_seen

    def serving(self) -> bool:
        """Requests may reach it now (a stop must recall and drain them first)."""
        return self.state in (S.READY, S.DRAINING, S.SLEEPING) or (
            self.state == S.STARTING and self.adopted and self.running
        )

    def killing(self) -> bool:
        return self._end is not None

    # ------------------------------------------------------------ the step

    def step(self, look: Look) -> Action:
        """The one action to take now."""
        if self._end is not None:
            raise RuntimeError("a kill is under way: report it with killed()")
        if self.state in (S.STOPPED, S.FAILED):
            return self._parked(look)
        if self.running and look.exited is not None:
            return self._exited(look)
        if self.going is not None:
            return self._leaving(look)
        if self.state == S.STARTING:
            return self._starting(look)
        if self.state == S.READY:
            return self._ready(look)
        if self.state == S.ASLEEP:
            return self._asleep(look)
        if self.state == S.WAKING:
            return self._waking(look)
        raise RuntimeError(f"no step in state {self.state}")

    def _parked(self, look: Look) -> Action:
        if look.want != Want.UP:
            return Idle()
        self.budget.reset()  # a new load: crashes of an earlier attempt do not count
        self.port_retries = 1
        self.ready_seen = self.adopted = False
        self._move(S.STARTING, Phase.of(Step.PROBING))
        return Launch()

    def _starting(self, look: Look) -> Action:
        if not self.running:  # between two launches: the crash backoff
            if look.want != Want.UP:
                self.backoff_until = None
                self._move(S.STOPPED, reason="stopped during restart backoff")
                return Idle()
            until = self.backoff_until or look.now
            if look.now < until:
                return Wait(until)
            self.backoff_until = None
            self._move(S.STARTING, Phase.of(Step.PROBING), reason=self.reason)
            return Launch()
        if look.want == Want.DOWN or (look.want == Want.ASLEEP and not self.sleeps):
            return self._go_down(look)  # (asked to sleep while loading: sleeps once ready)
        if look.healthy:
            self.ready_seen = True
            self._move(S.READY)
            return self._ready(look)
        if look.now >= self.deadline:
            if self.adopted:
                hang = self.settings.hang_timeout
                why = f"hung: the adopted engine did not answer /health within {hang:g}s"
                self.note = f"{why}; killing the engine"
                return self._kill(0.0, _End.CRASHED, why)
            t = self.settings.health_timeout
            why = f"not healthy within {t:g}s (health_timeout); killed"
            return self._kill(self.settings.stop_grace, _End.FAILED, why)
        return Wait(self.deadline)

    def _ready(self, look: Look) -> Action:
        if look.hung:
            why = f"hung: /health did not answer 200 for {self.settings.hang_timeout:g}s"
            self.note = f"{why}; killing the engine"
            return self._kill(0.0, _End.CRASHED, why)
        if look.want == Want.ASLEEP and self.sleeps:
            return self._leave(look, S.SLEEPING)
        if look.want != Want.UP:  # never a release without the saver: a stop instead
            return self._go_down(look)
        return Wait(math.inf)

    def _go_down(self, look: Look) -> Action:
        """A stop: recalled and drained first when it may be serving (and not forced)."""
        if look.force or not self.serving():
            return self._stop(look)
        return self._leave(look, S.DRAINING)

    def _leave(self, look: Look, to: State) -> Action:
        """Begin the way down: traffic off first (the drain's one budget starts now). A
        sleep shows at once; a stop shows ``draining`` only if there is a drain to wait."""
        budget = self.settings.drain_timeout if look.drain is None else look.drain
        self.going = to
        self.drain_until = look.now + budget
        self.off_traffic = self.unconfirmed = False
        self._reset_reads()
        self.fence = self.flush = self.flush_at = None
        if to == S.SLEEPING:
            self._move(S.SLEEPING, Phase.of(Step.DEREGISTERING))
        else:
            self.phase = Phase.of(Step.DEREGISTERING)
        return Deregister()

    def _leaving(self, look: Look) -> Action:
        # A request that arrives while it goes to sleep waits (the gate holds it: the
        # engine is not ready) and wakes it once asleep: the traffic is already off
        # (claims recalled, routers told), and a sleep is never called off half-way.
        sleep = self.going == S.SLEEPING
        if sleep and look.want == Want.DOWN:
            self.going = S.DRAINING
            sleep = False
        if not self.off_traffic:
            return Deregister()
        if look.force:
            return self._stop(look)
        if sleep and self.unconfirmed:
            why = "a router did not confirm the deregistration; stopped instead of sleeping"
            self.settle_want = Want.DOWN
            return self._kill(self.settings.stop_grace, _End.STOPPED, why, stopping=True)
        step = self._drain_step(look, sleep)
        if step is None:
            if not sleep:
                return self._stop(look)
            self.phase = Phase.of(Step.RELEASING)
            self.memory_released = True  # from the call on, nothing that generates is sent
            return ReleaseMemory()
        if look.now < self.drain_until:
            return step
        if sleep:
            if look.held:
                left = f"{look.held} held"
            elif self.fence is None:
                left = "the engine not idle"
            else:
                left = "the engine not proven idle behind its closed door"
            why = f"drain did not reach zero in time ({left}); stopped instead of sleeping"
            self.settle_want = Want.DOWN
            return self._kill(self.settings.stop_grace, _End.STOPPED, why, stopping=True)
        if look.held:
            self.note = f"drain ended with {look.held} request(s) still running"
        else:
            self.note = "drain ended with requests still running in the engine"
        return self._stop(look)

    def _drain_step(self, look: Look, sleep: bool) -> Action | None:
        """The next step of the way down, None once the engine may be stopped (or, for a
        sleep, released): holders gone; then, when the engine's own count matters, a
        zero reading taken after they left; then, for a sleep, the fence."""
        if look.held:
            self._draining(f"waiting for {look.held} request(s)")
            self._reset_reads()  # a reading taken before a holder came back is stale
            return Wait(self.drain_until)
        if not (sleep or self.settings.drain_engine):
            return None
        if self.fence is None and not (self.engine_load is not None and self.engine_load.quiet):
            self._draining("waiting for the engine")
            return self._read(look)
        if not sleep:
            return None
        return self._fence(look)

    def _draining(self, text: str) -> None:
        if self.state != S.SLEEPING and self.state != S.DRAINING:
            self._move(S.DRAINING, reason=self.down_reason)
        self.phase = Phase.of(Step.DRAINING, text)

    def _read(self, look: Look) -> Action:
        if self.load_read is None or look.now >= self.load_read + LOAD_POLL:
            return CheckLoad()
        return Wait(min(self.drain_until, self.load_read + LOAD_POLL))

    def _reset_reads(self) -> None:
        self.load_read = self.engine_load = self.quiet_since = None

    def _fence(self, look: Look) -> Action | None:
        """Close SGLang's door, then wait for the engine to prove itself idle behind it;
        None once it has (the release may go)."""
        self.phase = Phase.of(Step.FENCING)
        if self.fence is None:
            return Pause(self.drain_until)
        if self.fence == Fence.PAUSED and self.flush is not True and self.flush_at != math.inf:
            if self.flush_at is None or look.now >= self.flush_at + LOAD_POLL:
                return Flush(self.drain_until)
            return Wait(min(self.drain_until, self.flush_at + LOAD_POLL))
        if self._proven():
            return None
        return self._read(look)

    def _proven(self) -> bool:
        """Idle behind the door: with SGLang's own answer (the flush) a zero reading taken
        after the door closed; without one, zero readings for longer than SGLang's
        republish interval (also after the door closed, when there is one)."""
        last = self.engine_load
        if last is None or not last.quiet or self.load_read is None:
            return False
        if self.fence == Fence.PAUSED and self.flush is True and last.taken_after(self.barrier):
            return True
        return self.quiet_since is not None and self.load_read - self.quiet_since >= REPUBLISH

    def _stop(self, look: Look) -> Action:
        grace = 0.0 if look.force else self.settings.stop_grace
        return self._kill(grace, _End.STOPPED, None, stopping=True)

    def _asleep(self, look: Look) -> Action:
        if look.want == Want.DOWN:  # stopped without a wake
            return self._stop(look)
        if look.want == Want.UP and self.memory_unknown:
            # Released or not, paused or not: a resume of memory that is not released
            # takes SGLang down, a generation on released memory too. Loaded afresh.
            why = "asleep with its memory in a state ktd cannot know; loading it afresh"
            self.note = why
            return self._kill(self.settings.stop_grace, _End.RELOAD, why, stopping=True)
        if look.want == Want.UP:
            self._move(S.WAKING, Phase.of(Step.PLACING))
            return MakeRoom()
        return Wait(math.inf)

    def _waking(self, look: Look) -> Action:
        if look.want == Want.DOWN:
            return self._stop(look)
        if self.memory_released:
            if look.want == Want.ASLEEP:  # put back to sleep before the resume
                self._move(S.ASLEEP)
                return Wait(math.inf)
            return Resume()
        if self.door_closed:  # resumed: open SGLang's door before anything generates
            return Continue()
        if look.now >= self.deadline:
            t = self.settings.memory_timeout
            why = f"wake failed: not ready within {t:g}s after the resume; stopped"
            return self._kill(0.0, _End.DROPPED, why, stopping=True)
        if self.load_read is None or look.now >= self.load_read + LOAD_POLL:
            return CheckHealth()
        return Wait(min(self.deadline, self.load_read + LOAD_POLL))

    def _exited(self, look: Look) -> Action:
        out = look.exited
        assert out is not None
        going, self.going = self.going, None
        if self.state == S.ASLEEP or self.memory_released:
            # A dead engine is never woken: the next request loads it afresh.
            return self._kill(0.0, _End.DROPPED, f"exited while asleep: {out.reason or out.kind}")
        if going is not None:  # it was being stopped (or put to sleep) anyway: stopped
            if going == S.SLEEPING:
                self.settle_want = Want.DOWN
            why = f"exited while {going}: {out.reason or out.kind}"
            return self._kill(0.0, _End.STOPPED, why, stopping=True)
        if out.kind == "exited":  # a clean exit nobody asked for: not a crash
            return self._kill(0.0, _End.STOPPED, out.reason or "exited")
        if out.kind in RETRIED and self.port_retries > 0 and look.want == Want.UP:
            self.port_retries -= 1
            return self._kill(0.0, _End.RETRY, f"{out.reason}{RETRIED[out.kind]}")
        if out.kind == "crashed" and look.want == Want.UP:
            return self._kill(0.0, _End.CRASHED, out.reason or "crashed")
        return self._kill(0.0, _End.FAILED, out.reason or out.kind)

    def _kill(self, grace: float, end: _End, why: str | None, *, stopping: bool = False) -> Kill:
        """Decide a kill. ``stopping``: the state shows it (a stop asked for); a crash's
        or a failure's clean-up keeps the state until its outcome is known."""
        self._end = (end, why)
        self.going = None
        if stopping:
            self._move(S.STOPPING, Phase.of(Step.TERMINATING), reason=why or self.down_reason)
        return Kill(grace)

    # ------------------------------------------------------------ reports

    def adopt(
        self,
        adopted: State | None,
        deadline: float,
        *,
        sleeps: bool,
        step: str | None = None,
    ) -> None:
        """A previous daemon's engine, taken over running (``adopted``: its state then,
        ``step`` its phase). An asleep one stays asleep, never probed with a generation,
        until wanted; so does one that was fencing or releasing (SGLang's door closed,
        its memory maybe released: ``memory_unknown``), and it is loaded afresh when
        wanted. One that was waking is not trusted either: it may be released."""
        self.running = True
        self.adopted = True
        self.sleeps = sleeps
        self.ready_seen = adopted in (S.READY, S.ASLEEP, S.SLEEPING, S.WAKING)
        self.deadline = deadline
        self._move(S.STARTING, Phase.of(Step.ADOPTING))  # as the record shows it meanwhile
        unknown = (adopted == S.SLEEPING and step in (Step.FENCING, Step.RELEASING)) or (
            adopted == S.WAKING
        )
        if adopted == S.ASLEEP or unknown:
            self.memory_released = self.door_closed = True
            self.memory_unknown = unknown
            self._move(S.ASLEEP)

    def launched(self, failure: Outcome | None, deadline: float = math.inf) -> None:
        """The launch pipeline's end: None = the engine runs (healthy by ``deadline``)."""
        if failure is None:
            self.running = True
            self.deadline = deadline
            self.memory_released = False
            self.phase = Phase.of(Step.LOADING)
        elif failure.kind == "busy":
            self.settle_want = Want.DOWN
            self._move(S.STOPPED, reason=failure.reason, error_code=ErrorCode.BUSY)
        elif failure.kind == "stopped":
            self._move(S.STOPPED, reason=failure.reason or "stopped before launch")
        else:
            self.settle_want = Want.DOWN
            self._move(
                S.FAILED, reason=failure.reason or failure.kind, error_code=ErrorCode.LOAD_FAILED
            )

    def deregistered(self, confirmed: bool = True) -> None:
        """Traffic is off; ``confirmed``: every router has said it no longer lists the
        engine (a sleep needs that: a router that still lists it sends it requests and
        health checks)."""
        self.off_traffic = True
        self.unconfirmed = not confirmed

    def load(self, now: float, reading: EngineLoad | None) -> None:
        """What ``/v1/loads`` counted (None: no answer, or not SGLang's shape). For a
        stop, no answer ends the wait (SGLang's own SIGTERM drain is the backstop); for a
        sleep it cannot prove the engine idle, so it never releases."""
        self.load_read = now
        if reading is None and self.going != S.SLEEPING:
            reading = EngineLoad(0)
        self.engine_load = reading
        if reading is None or not reading.quiet:
            self.quiet_since = None
        elif self.quiet_since is None:
            self.quiet_since = now

    def paused(
        self,
        ok: bool,
        *,
        absent: bool = False,
        at: float = 0.0,
        why: str | None = None,
        instead: str | None = None,
    ) -> Kill | None:
        """``Pause``'s end: the door is closed (``at``: when, on the wall clock), this
        SGLang has none (``absent``: zero readings must do, unless that makes the sleep
        cost more than a reload: ``instead`` says so, ``ktd.core.sleepcost``), or it
        failed: then the engine cannot be fenced. Else it is stopped instead."""
        if self.state != S.SLEEPING:
            return None
        self._reset_reads()  # what counts from now on was read behind the door
        if ok:
            self.fence, self.door_closed, self.barrier = Fence.PAUSED, True, at
            return None
        if absent and instead is None:
            self.fence = Fence.READS
            self.note = "this SGLang has no /pause_generation: fenced by its load count alone"
            return None
        self.settle_want = Want.DOWN
        text = instead or f"sleep failed: SGLang did not hold new requests ({why}); stopped"
        return self._kill(self.settings.stop_grace, _End.STOPPED, text, stopping=True)

    def flushed(self, now: float, ok: bool, *, absent: bool = False) -> None:
        """``Flush``'s end: idle (``ok``), not yet (asked again after ``LOAD_POLL``), or
        no such route (the readings alone must prove it)."""
        if self.state != S.SLEEPING:
            return
        self.flush = ok
        self.flush_at = math.inf if absent else now

    def released(self, ok: bool, why: str | None = None) -> Kill | None:
        """The release answered (``ok``) or failed; after a failed one SGLang's memory is
        in an unknown state, so the engine is stopped."""
        if self.state != S.SLEEPING:
            return None
        if not ok:
            text = f"sleep failed: {why or 'the release did not answer'}; stopped"
            self.settle_want = Want.DOWN
            return self._kill(0.0, _End.STOPPED, text, stopping=True)
        self.going = None
        self._move(S.ASLEEP)
        return None

    def room(self, ok: bool, why: str | None = None, *, code: str = ErrorCode.BUSY,
             want: Want = Want.UP) -> None:  # fmt: skip
        """``MakeRoom``'s end: the wake may resume, or it cannot now (it stays asleep). A
        wake called off as wanted down (``want``: a restart, an evict) stays wanted down:
        stopped asleep next, never settled back to asleep (a restart waited for ever)."""
        if self.state != S.WAKING:
            return
        if ok:
            self.phase = Phase.of(Step.RESUMING)
        else:
            if want != Want.DOWN:
                self.settle_want = Want.ASLEEP
            self._move(S.ASLEEP, reason=why, error_code=code)

    def resumed(self, now: float, ok: bool, why: str | None = None) -> Kill | None:
        if self.state != S.WAKING:
            return None
        if not ok:
            text = f"wake failed: {why or 'the resume did not answer'}; stopped"
            return self._kill(0.0, _End.DROPPED, text, stopping=True)
        self.memory_released = False
        self.deadline = now + self.settings.memory_timeout
        self.load_read = None
        self.phase = Phase.of(Step.RESUMING if self.door_closed else Step.CHECKING)
        return None

    def continued(self, ok: bool, *, absent: bool = False, why: str | None = None) -> Kill | None:
        """``Continue``'s end: the door is open (or this SGLang never had one)."""
        if self.state != S.WAKING:
            return None
        if not (ok or absent):
            text = f"wake failed: SGLang did not let requests in again ({why}); stopped"
            return self._kill(0.0, _End.DROPPED, text, stopping=True)
        self.door_closed = False
        self.phase = Phase.of(Step.CHECKING)
        return None

    def checked(self, now: float, ok: bool) -> None:
        """The readiness check after a resume."""
        if self.state != S.WAKING:
            return
        self.load_read = now
        if ok:
            self._move(S.READY)

    def killed(self, now: float) -> None:
        """The stop sequence is over: no process of this run is left."""
        assert self._end is not None
        end, why = self._end
        self._end = None
        self.running = self.memory_released = self.adopted = False
        self.memory_unknown = self.door_closed = False
        if end == _End.STOPPED:
            if self.state != S.STOPPING:  # an exit nobody asked for: not to be redone
                self.settle_want = Want.DOWN
            self._move(S.STOPPED, reason=why or self.down_reason)
        elif end == _End.DROPPED:
            self.settle_want = Want.DOWN
            self._move(S.STOPPED, reason=why, error_code=ErrorCode.LOAD_FAILED)
        elif end == _End.RETRY:
            self.note = why
            self.ready_seen = False
            self.backoff_until = now
            self._move(S.STARTING, Phase.of(Step.PROBING), reason=why)
        elif end == _End.RELOAD:
            self.ready_seen = False
            self.backoff_until = now
            self._move(S.STARTING, Phase.of(Step.PROBING), reason=why)
        elif end == _End.FAILED or not self.settings.restart:
            self.settle_want = Want.DOWN
            self._move(S.FAILED, reason=why or end.value, error_code=ErrorCode.LOAD_FAILED)
        else:
            s = self.settings
            step = self.budget.on_crash(
                now,
                why or "crashed",
                window=s.restart_window,
                max_crashes=s.restart_max,
                backoff=s.restart_backoff,
            )
            if isinstance(step, GiveUp):
                self.settle_want = Want.DOWN
                self._move(S.FAILED, reason=step.reason, error_code=ErrorCode.LOAD_FAILED)
                return
            self.ready_seen = False
            self.backoff_until = now + step.delay
            self.note = f"{why or 'crashed'}; restarting in {step.delay:.1f}s"
            text = f"restart in {step.delay:.1f}s"
            self._move(S.STARTING, Phase.of(Step.RESTARTING, text), reason=why)

    def _move(
        self,
        state: State,
        phase: Phase | None = None,
        *,
        reason: str | None = None,
        error_code: str | None = None,
    ) -> None:
        if state != self.state:
            S.check(self.state, state)
        self.state = state
        self.phase = phase
        self.reason = reason
        self.error_code = error_code
