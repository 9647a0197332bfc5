"""One engine as the daemon knows it: its state, what others want of it, who holds it.

The state moves only in the engine's own supervisor task (``ktd.daemon.engine.supervisor``);
everyone else (control handlers, the frontends' claims, the TTL, a reload) sets a
*desire* (``request_up``/``request_down``) and waits for the state to change. That
is why 50 concurrent loads make one launch, and why nobody acts on a stale snapshot.
Who may use the engine is the admission gate's business (``ktd.core.admission``,
carried out by ``ktd.daemon.pool.gate``); this record only holds the leases and claims.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import trio

from ktd.core import states as S
from ktd.core.admission import EngineView, Gate, QueueLimits
from ktd.core.claimsync import ClaimRec
from ktd.core.config import DaemonSection, ModelSpec
from ktd.core.exits import Outcome
from ktd.core.expiry import IdleView, ttl_due
from ktd.core.lifecycle import Want
from ktd.core.reload import Existing
from ktd.core.restart import RestartBudget, retry_delay
from ktd.core.sglang_options import SGLangOptions
from ktd.core.states import Phase, State, Step
from ktd.daemon.engine import gpuexperts, health, weights
from ktd.daemon.engine.key import KeyDir
from ktd.daemon.engine.log import EngineLog
from ktd.daemon.engine.probe import Prober
from ktd.daemon.engine.running import Running as Running  # re-exported: pool modules import it here
from ktd.daemon.offload import Offload
from ktd.protocol import EngineInfo


class Busy(Exception):
    """The engine cannot be placed now; ``holders`` are the engines in the way."""

    def __init__(self, message: str, holders: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.holders = holders


class Unplaceable(Exception):
    """No state of the other engines would let this engine be placed (a config error)."""


class PlacementLike(Protocol):
    @property
    def numa_nodes(self) -> tuple[int, ...]: ...
    @property
    def cpus(self) -> tuple[int, ...]: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...

    def argv_flags(self) -> list[str]: ...

    def to_dict(self) -> dict[str, Any]: ...


class EngineHost(Protocol):
    """What an engine needs from the pool around it (kept narrow so engines test alone)."""

    @property
    def settings(self) -> DaemonSection: ...
    @property
    def log_dir(self) -> Path: ...
    @property
    def prober(self) -> Prober: ...
    @property
    def http(self) -> httpx.AsyncClient: ...
    @property
    def key_dir(self) -> KeyDir: ...  # the engines' API key files
    @property
    def offload(self) -> Offload: ...  # blocking work off the trio thread
    @property
    def base_env(self) -> Mapping[str, str]: ...
    @property
    def instance(self) -> str: ...  # this daemon's key, prefixed to every engine id
    @property
    def keeping_engines(self) -> bool: ...  # the daemon exits and leaves engines running
    @property
    def closing(self) -> bool: ...  # the daemon shuts down

    async def place(self, engine: Engine) -> PlacementLike | None: ...

    def state_changed(self, engine: Engine) -> None: ...  # a new state or phase: published

    def engine_changed(self, engine: Engine) -> None: ...  # anything: admission looks again

    async def before_drain(self, engine: Engine) -> bool: ...  # True: routers confirmed

    async def make_room(self, engine: Engine) -> str | None: ...  # a wake's swap; None = done

    @property
    def engine_drain(self) -> bool: ...  # a stop waits for the engine's /v1/loads too

    def log_lines(self, engine: Engine, lines: list[str]) -> None: ...

    def loaded(self, engine: Engine, seconds: float) -> None: ...  # a launch became ready

    def load_failed(self, engine: Engine) -> None: ...  # a launch ended without ready

    def expected_load(self, alias: str) -> float | None: ...  # the load ETA, if known


@dataclass
class Lease:
    id: str
    client: str
    since: float = field(default_factory=time.time)


@dataclass
class Stats:
    """Counters and last values for status; nothing decides on them but the retry delay."""

    restarts: int = 0
    evictions: int = 0  # stopped to make room for another engine
    loads: int = 0  # launches that reached ready
    load_seconds: float | None = None
    load_seconds_total: float = 0.0
    failures: int = 0  # consecutive failed loads
    failed_at: float = 0.0  # trio clock of the last failure
    load_started: float | None = None  # wall clock: when this load began
    load_percent: float | None = None  # how far the engine's log says this load's step is
    last_log: str | None = None
    made_room: tuple[str, ...] = ()  # engines this run's load stopped to make room
    owed: bool = False  # made_room is to be brought back if this load fails before ready


class Engine:
    def __init__(self, spec: ModelSpec, host: EngineHost) -> None:
        self.spec = spec
        self.host = host
        # Moved by the supervisor only.
        self.state: State = S.STOPPED
        self.since = time.time()
        self.reason: str | None = None
        self.error_code: str | None = None  # why the last attempt ended, for load waiters
        self.phase: Phase | None = None
        # Desires: set by anyone, read by the supervisor.
        self.want = Want.DOWN
        self.ups = 0  # request_up() calls: an evict sees a load that overtook it
        # Arrivals in stopped or failed, and in asleep: a waiter sees the engine came to
        # rest even when a load started it again before the waiter ran.
        self.stops = 0
        self.sleeps_done = 0
        self.down_reason: str | None = None
        self.force = False
        self.drain_timeout: float | None = None
        self.downs = 0  # request_down() calls: a deferred restart sees an evict since
        # The config's view of it (reload).
        self.retired = False  # removed from config: stop and forget
        self.finished = False  # the supervisor task has returned
        self.pending_spec: ModelSpec | None = None
        self.stale = False
        # A reload's restart is under way (down, then up with the new launch): who
        # waits for the load rides the next one instead of failing with the stop.
        self.restarting = False
        # Its processes and where they run.
        self.run: Running | None = None
        self.plan: PlacementLike | None = None
        self.keep_alive: float | None = None  # a client's idle TTL until it next stops
        self.adopt: Running | None = None  # a previous daemon's engine, to take over
        self.catalog: SGLangOptions | None = None  # the installed SGLang's options (the probe)
        self.launch_notes: tuple[str, ...] = ()  # flags ktd left out, and why
        self.budget = RestartBudget()  # crashes of this load, and its backoff
        # Who holds it, and who waits for it.
        self.leases: dict[str, Lease] = {}
        self.claims: dict[str, ClaimRec] = {}  # frontends' standing claims (claimtable.py)
        self.gate = Gate()
        self.remote_queued = 0  # requests the frontends say wait for this engine
        self.remote_since: float | None = None  # wall clock: the oldest of them came
        self.idle_since: float | None = None  # end of its last request (monotonic); None: never
        #                                      used nor ready
        self.stats = Stats()
        self.asleep_since: float | None = None  # wall clock: when it fell asleep
        self.asleep_at: float | None = None  # the same on the monotonic clock (sleep_ttl)
        self.host_bytes: int | None = None  # host RAM it holds asleep (the estimate)
        # This run has slept once: it holds the pinned host copy of its GPU weights from
        # then on, awake too (torch_memory_saver keeps it after a resume).
        self.backed_up = False
        self.gpu_residue: dict[int, int] | None = None  # asleep, per GPU (nvidia-smi)
        self.sleeps = False  # its running SGLang has the memory saver (the launch says)
        self._poke: Callable[[], None] = lambda: None  # its supervisor looks again
        self._changed = trio.Event()
        self.log = self._open_log()

    def _open_log(self) -> EngineLog:
        """Its log file under the daemon's log dir, rotated as the settings say; each
        new line is handed to the host (the log's subscribers)."""
        d, host = self.host.settings, self.host
        return EngineLog(
            host.log_dir / f"{self.spec.alias}.log",
            max_bytes=d.log_max_bytes,
            backups=d.log_backups,
            publish=lambda lines: host.log_lines(self, lines),
        )

    # ------------------------------------------------------------ queries

    @property
    def want_up(self) -> bool:
        return self.want == Want.UP

    @want_up.setter
    def want_up(self, up: bool) -> None:
        self.want = Want.UP if up else Want.DOWN

    def on_change(self, poke: Callable[[], None]) -> None:
        """Its supervisor's wake-up (set once, by the supervisor: no import between them)."""
        self._poke = poke

    def sleep_mode(self) -> str:
        """``on``: sleeps instead of stopping; ``unsupported``: configured, but its SGLang
        has no memory saver (swaps reload); ``off``: not configured."""
        if not self.spec.sleep:
            return "off"
        if self.run is not None or self.adopt is not None:
            return "on" if self.sleeps else "unsupported"
        if self.catalog is not None and self.catalog.exact("--enable-memory-saver") is None:
            return "unsupported"
        return "on"

    @property
    def alias(self) -> str:
        return self.spec.alias

    @property
    def url(self) -> str | None:
        return None if self.run is None else self.url_for(self.run)

    @property
    def api_key(self) -> str | None:
        """Its run's API key (what every client of the engine sends); never in ``info``."""
        return None if self.run is None else self.run.api_key

    def url_for(self, run: Running) -> str:
        """Where to reach the engine: a wildcard bind is reached on loopback."""
        return health.engine_url(self.spec.host, run.port)

    @property
    def limits(self) -> QueueLimits:
        return QueueLimits(self.spec.max_concurrent, self.spec.max_queue)

    def in_flight(self) -> int:
        """Requests in flight: acquire leases, and what the claims' holders report."""
        return len(self.leases) + sum(c.counts_as for c in self.claims.values())

    def existing(self) -> Existing:
        """What a reload's or a config change's diff reads of it."""
        return Existing(
            spec=self.spec,
            state=self.state,
            in_flight=self.in_flight(),
            retired=self.retired,
            finished=self.finished,
            restart_pending=self.pending_spec is not None,
        )

    def holds_resources(self) -> bool:
        """It holds its NUMA nodes' CPUs and its GPUs now (``ktd.core.states.holds``)."""
        return S.holds(self.state, self.phase.step if self.phase else None)

    def occupant(self) -> weights.Occupant | None:
        """What a memory fit counts of it (None: not placed)."""
        if self.plan is None:
            return None
        nodes, gpus = tuple(self.plan.numa_nodes), tuple(self.plan.gpus)
        asleep = self.state == S.ASLEEP
        return weights.Occupant(
            self.spec, nodes, gpus, self.backed_up, self.gpu_residue, asleep=asleep
        )

    def holding(self) -> bool:
        """Someone may still send it requests: a drain waits for this to end."""
        return bool(self.leases or self.claims)

    def holders(self) -> int:
        """Leases and claims on it (a drain, and a sleep's release, wait for zero)."""
        return len(self.leases) + len(self.claims)

    def adopting(self) -> bool:
        """A previous daemon's engine not yet seen healthy by this one (its streams may
        be running: a stop drains it, its restored claims live)."""
        if self.state != S.STARTING:
            return False
        run = self.adopt or self.run
        adopted = run is not None and run.adopted_state is not None
        return adopted or (self.phase is not None and self.phase.step == Step.ADOPTING)

    def view(self) -> EngineView:
        """What its admission gate reads."""
        return EngineView(
            state=self.state,
            want_up=self.want_up,
            in_flight=self.in_flight(),
            retry_in=self.retry_in() if self.state == S.FAILED else 0.0,
            retired=self.retired,
            closing=self.host.closing,
            restarting=self.restarting,
            stopping=self.want == Want.DOWN and self.state in S.HAS_PROCESSES,
        )

    def ttl(self) -> float:
        """The idle TTL now: a client's keep-alive (Ollama's ``keep_alive``) until the
        engine next stops, else the config's."""
        return self.spec.ttl if self.keep_alive is None else self.keep_alive

    def idle_view(self) -> IdleView:
        """What the idle TTL reads."""
        return IdleView(
            alias=self.alias,
            ttl=self.ttl(),
            state=self.state,
            want_up=self.want_up,
            in_flight=self.in_flight(),
            claims=len(self.claims),
            waiting=len(self.gate.line) + self.remote_queued,
            idle_since=self.idle_since if self.idle_since is not None else trio.current_time(),
            sleeps=self.sleep_mode() == "on",
            sleep_ttl=self.spec.sleep_ttl,
            asleep_at=self.asleep_at,
        )

    def _expires_at(self, due: float | None, last_used: float | None) -> float | None:
        """When the TTL acts (wall clock): the idle TTL, or asleep, the ``sleep_ttl``."""
        if due is None:
            return None
        if self.state == S.ASLEEP:
            return None if self.asleep_since is None else self.asleep_since + self.spec.sleep_ttl
        return None if last_used is None else last_used + self.ttl()

    def retry_in(self) -> float:
        """Seconds until a request may retry this failed engine (0 = now)."""
        delay = retry_delay(self.stats.failures, self.host.settings.restart_backoff)
        return max(0.0, self.stats.failed_at + delay - trio.current_time())

    def queued(self) -> int:
        """Requests waiting for it: acquires here, and what the frontends report."""
        return self.gate.leases_waiting() + self.remote_queued

    def moment(self) -> dict[str, Any]:
        """What the engine is doing now, the fields that status (``EngineInfo``) and the
        ``engine.<alias>`` events (``Event``) share: one projection, so the two cannot
        tell different stories. A previous daemon's engine is shown as soon as it is
        known, before its supervisor takes it over."""
        run, phase = self.run or self.adopt, self.phase
        starting = self.state == S.STARTING
        return {
            "alias": self.alias,
            "state": self.state,
            "reason": self.reason,
            "pid": run.pid if run else None,
            "port": run.port if run else None,
            "phase": phase.text if phase else None,
            "step": phase.step if phase else None,
            "waiting_for": list(phase.waiting_for()) if phase else [],
            "load_started": self.stats.load_started if starting else None,
            "load_eta": self.host.expected_load(self.alias) if starting else None,
            "load_percent": self.stats.load_percent if starting else None,
        }

    def launch_spec(self) -> ModelSpec:
        """The spec a launch runs: a derived ``--kt-num-gpu-experts`` as the pool's keeper
        says (an out-of-memory retry's count, or the one kept here: ``gpuexperts``)."""
        keeper = gpuexperts.keeper_of(self.host)
        return self.spec if keeper is None else keeper.spec(self)

    def exit_outcome(self, out: Outcome) -> Outcome:
        """An exit's outcome, an out-of-memory load of a derived count made a retry."""
        keeper = gpuexperts.keeper_of(self.host)
        return out if keeper is None else keeper.outcome(self, out, self.log.last(80))

    def info(self, *, tail: int = 0) -> EngineInfo:
        run, plan, st = self.run or self.adopt, self.plan, self.stats
        last_used = None
        if self.idle_since is not None:
            last_used = time.time() - (trio.current_time() - self.idle_since)
        due = ttl_due(self.idle_view())
        # Status shows what a load of it would take before one starts, too.
        moment = {**self.moment(), "load_eta": self.host.expected_load(self.alias)}
        return EngineInfo(
            **moment,
            started_at=run.started_at if run else None,
            ttl=self.ttl(),
            expires_at=self._expires_at(due, last_used),
            last_log=st.last_log,
            argv=list(run.argv) if run else [],
            numa_nodes=list(plan.numa_nodes) if plan else [],
            gpus=list(plan.gpus) if plan else [],
            cpus=list(plan.cpus) if plan else [],
            since=self.since,
            in_flight=self.in_flight(),
            claims=len(self.claims),
            url=self.url if self.state in (S.READY, S.DRAINING) else None,
            restarts=st.restarts,
            last_used=last_used,
            pinned=self.spec.pinned,
            stale=self.stale,
            log_tail=self.log.last(tail) if tail else [],
            made_room=list(st.made_room),
            sglang=self.catalog.label if self.catalog else None,
            notes=list(self.launch_notes) if run else [],
            queued=self.queued(),
            max_concurrent=self.spec.max_concurrent,
            max_queue=self.spec.max_queue,
            evictions=st.evictions,
            loads=st.loads,
            load_seconds=st.load_seconds,
            load_seconds_total=st.load_seconds_total,
            failures=st.failures,
            retry_in=self.retry_in() if self.state == S.FAILED else None,
            sleep=self.sleep_mode(),
            asleep_since=self.asleep_since if self.state == S.ASLEEP else None,
            sleep_ttl=self.spec.sleep_ttl,
            host_bytes=self.host_bytes if self.state == S.ASLEEP else None,
            queued_since=self.remote_since if self.remote_queued else None,
        )

    # ------------------------------------------------------------ requests (any task)

    def begin_adoption(self, run: Running) -> None:
        """A previous daemon's engine, shown as adopting from the moment its record is
        read: the control socket serves before the supervisor first runs, and a status
        or an evict in between must see a running engine, not a stopped one (an evict
        there was lost, and the engine served on). One that daemon was stopping is
        stopped: a ``kill -9`` of ktd must not undo an evict."""
        self.adopt = run
        if run.adopted_state in (S.ASLEEP, S.SLEEPING):
            self.want = Want.ASLEEP  # asleep (the sleep under way goes on) until wanted
        elif run.adopted_state in (S.DRAINING, S.STOPPING):
            self.want = Want.DOWN
        else:
            self.want = Want.UP
        self.state = S.STARTING
        self.since = time.time()
        self.phase = Phase.of(Step.ADOPTING)

    def request_up(self) -> None:
        if self.retired:
            return
        self.want = Want.UP
        self.ups += 1
        self.force = False
        self.down_reason = None
        self.notify_changed()

    def request_down(
        self,
        *,
        force: bool = False,
        drain_timeout: float | None = None,
        reason: str | None = None,
    ) -> None:
        """``reason`` (e.g. "evicted to make room for X") stays on the engine's way down
        and in its stopped status, so the operator sees why it went."""
        self.want = Want.DOWN
        self.down_reason = reason or self.down_reason
        self.downs += 1
        self.force = self.force or force
        self.drain_timeout = drain_timeout
        self.notify_changed()

    def request_sleep(
        self, *, drain_timeout: float | None = None, reason: str | None = None
    ) -> None:
        """Put it to sleep once drained (a swap, the idle TTL, ``ktctl sleep``). Without
        the memory saver the machine stops it instead: never a release without it."""
        if self.want == Want.DOWN and self.state in (S.STOPPED, S.FAILED):
            return
        self.want = Want.ASLEEP
        self.force = False
        self.down_reason = reason or self.down_reason
        self.drain_timeout = drain_timeout
        self.notify_changed()

    def used(self, *, ago: float, busy: bool) -> None:
        """A holder's report: the idle TTL counts from its last request's end."""
        when = trio.current_time() - (0.0 if busy else ago)
        if self.idle_since is None or when > self.idle_since:
            self.idle_since = when

    def add_lease(self, lease: Lease) -> None:
        self.leases[lease.id] = lease
        self.used(ago=0, busy=True)

    def drop_lease(self, lease_id: str) -> bool:
        if self.leases.pop(lease_id, None) is None:
            return False
        self.used(ago=0, busy=True)
        self.notify_changed()  # waiters on "no leases" (drain, restart-when-idle, the line)
        return True

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.notify_changed()
        self.host.state_changed(self)

    # ------------------------------------------------------------ waiting (any task)

    def notify_changed(self) -> None:
        """Something about it changed: its waiters and its admission gate look again."""
        self._changed.set()
        self._changed = trio.Event()
        self._poke()
        self.host.engine_changed(self)

    async def wait_changed(self) -> None:
        await self._changed.wait()

    async def wait_until(self, pred: Callable[[], bool], timeout: float = math.inf) -> bool:
        with trio.move_on_after(timeout):
            while not pred():
                await self._changed.wait()
            return True
        return False

    async def wait_stopped(self) -> None:
        """Until it is stopped or failed, or has been since this call (a load may have
        started it again at once)."""
        mark = self.stops
        await self.wait_until(lambda: self.state in (S.STOPPED, S.FAILED) or self.stops > mark)

    async def wait_off(self) -> None:
        """Until it holds no CPU or GPU (stopped, failed or asleep), or has since this call
        (a swap's wait: a request may have started or woken it again at once)."""
        stops, sleeps = self.stops, self.sleeps_done
        await self.wait_until(
            lambda: not self.holds_resources() or self.stops > stops or self.sleeps_done > sleeps
        )

    def load_settled(self) -> bool:
        """For load waiters: ready, or the attempt ended without it (failed, stopped, or
        still asleep: a wake that found no room)."""
        if self.state == S.READY:
            return True
        if self.restarting:
            return False  # the reload brings it up again: the load goes on
        return not self.want_up and self.state in (S.FAILED, S.STOPPED, S.ASLEEP)
