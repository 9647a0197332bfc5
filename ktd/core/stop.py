"""The stop of one engine (pure): which signal goes to which process, and when.

SGLang's designed shutdown is SIGTERM to its *server* process alone: it drains
its requests and exits, and its scheduler and detokenizer follow by PDEATHSIG
within about two seconds. A SIGTERM to the whole group kills the scheduler
first, which SGLang reports as a crash (it then waits 5 s "before crash
diagnostics"). So the server gets ``grace`` seconds on its own; once it is gone,
what is left (a helper without PDEATHSIG, a wrapper shell, a crashed engine's
stray child) gets SIGTERM and, ``follow`` seconds later, SIGKILL. Waiting for the
whole grace after the server has exited would only keep the caller (an evict, a
swap, a reload, ktd's own shutdown) waiting for processes that serve nothing.

``StopMachine`` is fed observations and the clock and answers one action at a
time; ``ktd.daemon.engine.kill`` carries the actions out on real processes.
``find_server`` says which process the server is. ``docs/stop.md`` has the
table of phases, events and actions.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ktd.core.action import MachineAction

__all__ = [
    "FOLLOW",
    "KILL_BOUND",
    "Action",
    "Done",
    "ObserveAt",
    "Observed",
    "Scan",
    "Send",
    "StopMachine",
    "StopPhase",
    "Target",
    "find_server",
    "launch_tail",
]

#: Seconds the processes left after the server get between their SIGTERM and the
#: SIGKILL. SGLang's own children are gone 1.5-2 s after its server process.
FOLLOW = 3.0
#: Seconds SIGKILLed processes get to be gone (a process in uninterruptible sleep,
#: e.g. in a GPU driver call, dies only when the call returns); then the stop ends
#: and says what is left.
KILL_BOUND = 10.0


class StopPhase(StrEnum):
    START = "start"  # nothing sent yet
    DRAIN = "drain"  # the server has SIGTERM and drains, bounded by the grace
    FOLLOW = "follow"  # the server is gone; the rest have SIGTERM, bounded by FOLLOW
    KILL = "kill"  # SIGKILL sent; waiting for everything to be gone (KILL_BOUND)
    DONE = "done"


class Target(StrEnum):
    SERVER = "server"  # SGLang's server process only
    REST = "rest"  # every member but the server
    ALL = "all"  # every member (and the group, while its verified leader lives)


@dataclass(frozen=True)
class Observed:
    """One observation. ``others``: members other than the server that are alive.
    ``full``: it comes from a full scan for the engine's members (which finds
    processes forked since the last one), not only from the members known so far."""

    now: float
    server: bool
    others: int
    full: bool = False


class Send(MachineAction):
    sig: signal.Signals
    to: Target
    why: str = ""  # the end of the log line "SIGKILL to N process(es) <why>"; "" = none


class ObserveAt(MachineAction):
    """Observe again at ``until`` at the latest. ``on_server``: the wait may end at
    the server's exit (an event where there is one); else poll the members."""

    until: float
    on_server: bool


class Scan(MachineAction):
    """Observe again with a full member scan (``Observed.full``)."""


class Done(MachineAction):
    """The stop is over. ``terminated``: the server got SIGTERM; ``killed``: ktd sent
    SIGKILL; ``left``: something was still alive when the kill bound ran out."""

    terminated: bool
    killed: bool
    left: bool = False


Action = Send | ObserveAt | Scan | Done


class StopMachine:
    """One stop. ``grace`` <= 0 (a forced evict, a crash's clean-up, a hung engine)
    SIGKILLs everything at once. Every deadline is fixed when its phase begins, so
    a stop ends by ``start + grace + follow + kill_bound`` whatever happens."""

    def __init__(
        self, grace: float, *, follow: float = FOLLOW, kill_bound: float = KILL_BOUND
    ) -> None:
        self.grace = grace
        self.follow = follow
        self.kill_bound = kill_bound
        self.phase = StopPhase.START
        self.started: float | None = None
        self.deadline = 0.0  # the current phase's
        self.terminated = False
        self.killed = False
        self._rest_target = Target.ALL  # what a SIGKILL in the kill phase goes to
        self._sent = False  # the current phase's signal went out since the last scan
        self._last_scan = False  # the kill bound ran out and a last scan was asked for

    def step(self, seen: Observed) -> Action:
        if self.phase is StopPhase.DONE:
            raise RuntimeError("the stop is already done")
        if self.started is None:
            self.started = seen.now
            return self._start(seen)
        if self.phase is StopPhase.DRAIN:
            return self._drain(seen)
        if self.phase is StopPhase.FOLLOW:
            return self._follow(seen)
        return self._kill(seen)

    def bound(self) -> float:
        """The latest time this stop can end (once it has begun)."""
        start = self.started or 0.0
        return start + max(self.grace, 0.0) + self.follow + self.kill_bound

    # ------------------------------------------------------------ phases

    def _start(self, seen: Observed) -> Action:
        if not seen.server and not seen.others:
            return self._confirm(seen)
        if self.grace <= 0:
            return self._enter_kill(seen.now, Target.ALL, why="")
        if seen.server:
            self.phase = StopPhase.DRAIN
            self.deadline = seen.now + self.grace
            self.terminated = True
            return Send(signal.SIGTERM, Target.SERVER)
        return self._enter_follow(seen)

    def _drain(self, seen: Observed) -> Action:
        if not seen.server:
            return self._enter_follow(seen)
        if seen.now >= self.deadline:
            return self._enter_kill(seen.now, Target.ALL, why=f"left after {self.grace:g}s")
        return ObserveAt(self.deadline, on_server=True)

    def _enter_follow(self, seen: Observed) -> Action:
        self.phase = StopPhase.FOLLOW
        self.deadline = seen.now + self.follow
        self._sent = False
        # The server's exit changed the tree (its orphans are no one's descendants
        # now): the SIGTERM goes to what a full scan finds, not to the members known
        # when the stop began.
        return self._follow(seen) if seen.full else Scan()

    def _follow(self, seen: Observed) -> Action:
        if not seen.others:
            return self._confirm(seen)
        if seen.now >= self.deadline:
            why = f"left {self.follow:g}s after the server exited"
            return self._enter_kill(seen.now, Target.REST, why=why)
        if not self._sent or seen.full:
            self._sent = True  # a full scan that finds someone: late forks get theirs
            return Send(signal.SIGTERM, Target.REST)
        return ObserveAt(self.deadline, on_server=False)

    def _enter_kill(self, now: float, target: Target, *, why: str) -> Action:
        self.phase = StopPhase.KILL
        self.deadline = now + self.kill_bound
        self._rest_target = target
        self.killed = True
        self._sent = True
        return Send(signal.SIGKILL, target, why)

    def _kill(self, seen: Observed) -> Action:
        if not seen.server and not seen.others:
            return self._confirm(seen)
        if not self._sent or seen.full:
            self._sent = True  # also past the deadline: a last SIGKILL costs no time
            return Send(signal.SIGKILL, self._rest_target)
        if seen.now >= self.deadline:
            if not self._last_scan:  # what forked meanwhile gets its SIGKILL too
                self._last_scan = True
                return Scan()
            return self._done(left=True)
        return ObserveAt(self.deadline, on_server=False)

    def _confirm(self, seen: Observed) -> Action:
        """Nothing alive of what is known: a full scan has the last word (a process
        forked meanwhile is not known yet)."""
        return self._done(left=False) if seen.full else Scan()

    def _done(self, *, left: bool) -> Done:
        self.phase = StopPhase.DONE
        return Done(terminated=self.terminated, killed=self.killed, left=left)


# ---------------------------------------------------------------- the server process


def launch_tail(argv: Sequence[str]) -> tuple[str, ...]:
    """What a process running ktd's launch command has at the end of its command line,
    whatever runs it: from the ``-m`` of ``<python> -m sglang.launch_server ...`` on
    (an adopted engine's recorded argv may be a wrapper's ``/bin/sh wrapper -m ...``),
    else everything after the interpreter."""
    args = list(argv)
    if "-m" in args:
        return tuple(args[args.index("-m") :])
    return tuple(args[1:])


def find_server(
    rows: Iterable[tuple[int, int, Sequence[str]]], root: int, argv: Sequence[str]
) -> int:
    """SGLang's server process among an engine's members, from ``(pid, ppid, cmdline)``
    rows: the deepest process whose command line ends with ``launch_tail(argv)``.

    Deepest, because a wrapper interpreter that does not ``exec`` (a shell script as
    ``python``: conda, environment modules) has the same arguments at the end of its
    own command line. A match whose parent has the very same command line is a fork of
    it, not a new program, and does not count; SGLang's children (``sglang::scheduler``,
    multiprocessing's spawn) never match. Without a match: ``root``."""
    tail = tuple(launch_tail(argv))
    table = {pid: (ppid, tuple(cmd)) for pid, ppid, cmd in rows}
    if not tail:
        return root

    def matches(pid: int) -> bool:
        cmd = table[pid][1]
        return len(cmd) > len(tail) and cmd[-len(tail) :] == tail

    def depth(pid: int) -> int:
        seen = {pid}
        n = 0
        parent = table[pid][0]
        while parent in table and parent not in seen:
            seen.add(parent)
            n += 1
            parent = table[parent][0]
        return n

    candidates = [
        pid
        for pid in table
        if matches(pid)
        and not (table[pid][0] in table and table[table[pid][0]][1] == table[pid][1])
    ]
    if not candidates:
        return root
    return max(candidates, key=lambda pid: (depth(pid), pid == root, -pid))
