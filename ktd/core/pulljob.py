"""Pull jobs over time (pure): which job runs, which waits, when one is stalled, restarted,
failed, cancelled or done. Events and the clock in, actions out; ``ktd.catalog.pulls``
carries the actions out on worker processes (``python -m ktd.catalog.fetch``).

One job per ``(repo, revision)`` however many ask (``ask`` joins a live job); at most
``max_pulls`` run at once, the rest wait in the order asked. A running job goes
``plan`` (the worker reads the hub's metadata and the disk and stops: the fit check is
the driver's, before any byte) then ``fetch``. A job that gets no byte for
``stall_timeout`` is killed and restarted (resumed by Range), up to ``max_restarts``
times, then failed ``stalled``; a worker that ends with a passing error (the network,
the hub's 5xx, a lock still held by a dying worker) is restarted after ``retry_delay``
the same way. Gated, missing, disk, checksum and refusals fail at once: a retry would
get the same answer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from ktd.core.action import MachineAction

#: Errors worth a retry: another try may well pass.
PASSING = frozenset({"network", "server", "busy", "died"})
#: Seconds of progress the rate is measured over.
RATE_WINDOW = 5.0

Key = tuple[str, str]


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


LIVE = frozenset({JobState.QUEUED, JobState.RUNNING})


class Start(MachineAction):
    """Start the job's worker: ``phase`` ``plan`` (plan only) or ``fetch``."""

    key: Key
    phase: str
    force: bool


class KillWorker(MachineAction):
    """Kill the job's worker (a stall or a cancel); its ``exited`` follows."""

    key: Key
    reason: str


class CheckFit(MachineAction):
    """The plan is in: run the fit check on it, answer with ``checked``."""

    key: Key


Action = Start | KillWorker | CheckFit


@dataclass
class Job:
    key: Key
    seq: int
    names: list[str]
    force: bool = False
    state: JobState = JobState.QUEUED
    phase: str = "plan"
    not_before: float = 0.0
    started: float | None = None
    last_byte: float = 0.0
    sizes: dict[str, int] = field(default_factory=dict)
    done_of: dict[str, int] = field(default_factory=dict)
    file: str = ""
    restarts: int = 0
    kind: str = ""  # the error's kind (failed), or the reason a kill is pending
    message: str = ""
    killing: str = ""
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    @property
    def done(self) -> int:
        return sum(min(self.done_of.get(n, 0), s) for n, s in self.sizes.items())

    @property
    def rate(self) -> float:
        """Bytes a second over the last ``RATE_WINDOW`` seconds of progress."""
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def eta(self) -> float | None:
        rate = self.rate
        return (self.total - self.done) / rate if rate > 0 else None


class PullMachine:
    def __init__(
        self,
        *,
        max_pulls: int,
        stall_timeout: float,
        max_restarts: int = 3,
        retry_delay: float = 2.0,
    ) -> None:
        self.max_pulls = max(1, max_pulls)
        self.stall_timeout = stall_timeout
        self.max_restarts = max_restarts
        self.retry_delay = retry_delay
        self.jobs: dict[Key, Job] = {}
        self._seq = 0

    # ------------------------------------------------------------ events

    def ask(self, key: Key, name: str, now: float, *, force: bool = False) -> tuple[Job, bool]:
        """Someone wants ``key``: the live job (joined: True), or a new one queued."""
        job = self.jobs.get(key)
        if job is not None and job.state in LIVE:
            if name not in job.names:
                job.names.append(name)
            job.force = job.force or force
            return job, True
        self._seq += 1
        job = Job(key=key, seq=self._seq, names=[name], force=force, not_before=now)
        self.jobs[key] = job
        return job, False

    def tick(self, now: float) -> list[Action]:
        """Stalls found, waiting jobs started within the bound."""
        actions: list[Action] = []
        for job in self.jobs.values():
            if (
                job.state is JobState.RUNNING
                and not job.killing
                and now - job.last_byte > self.stall_timeout
            ):
                job.killing = "stall"
                actions.append(KillWorker(job.key, "stall"))
        running = sum(1 for j in self.jobs.values() if j.state is JobState.RUNNING)
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            if running >= self.max_pulls:
                break
            if job.state is JobState.QUEUED and job.not_before <= now:
                job.state = JobState.RUNNING
                job.started = job.started if job.started is not None else now
                job.last_byte = now
                job.samples.clear()
                running += 1
                actions.append(Start(job.key, job.phase, job.force))
        return actions

    def progress(self, key: Key, file: str, done: int, total: int, now: float) -> None:
        """A worker's ``file``/``bytes`` line: a byte is a sign of life."""
        job = self.jobs.get(key)
        if job is None or job.state is not JobState.RUNNING:
            return
        job.file = file
        if total:
            job.sizes[file] = total
        moved = done != job.done_of.get(file)
        job.done_of[file] = done
        if moved:
            job.last_byte = now
            job.samples.append((now, job.done))
            while len(job.samples) > 2 and now - job.samples[0][0] > RATE_WINDOW:
                job.samples.popleft()

    def planned(self, key: Key, files: dict[str, tuple[int, int]], now: float) -> list[Action]:
        """The plan worker's plan: file → (size, bytes present); the fit check next."""
        job = self.jobs.get(key)
        if job is None or job.state is not JobState.RUNNING:
            return []
        job.sizes = {n: s for n, (s, _) in files.items()}
        job.done_of = {n: p for n, (_, p) in files.items()}
        job.last_byte = now
        return [CheckFit(key)]

    def checked(self, key: Key, problems: list[str], now: float) -> list[Action]:
        """The plan's verdict: refused (unless forced), or the fetch starts."""
        job = self.jobs.get(key)
        if job is None or job.state is not JobState.RUNNING or job.phase != "plan":
            return []
        if problems and not job.force:
            self._end(job, JobState.FAILED, "refused", "; ".join(problems))
            return self.tick(now)
        job.phase = "fetch"
        job.last_byte = now
        job.killing = ""  # a stall seen while the check ran had no worker to kill
        return [Start(key, "fetch", job.force)]

    def exited(self, key: Key, kind: str, message: str, now: float) -> list[Action]:
        """The worker ended: ``kind`` "" for success (of its phase), else its error's kind
        ("died" when it said nothing)."""
        job = self.jobs.get(key)
        if job is None or job.state is not JobState.RUNNING:
            return self.tick(now)
        killing, job.killing = job.killing, ""
        if job.phase == "plan" and not kind and not killing:
            kind = "died"  # a plan worker's success is ``planned``, never an exit
        if killing == "cancel":
            self._end(job, JobState.CANCELLED, "cancelled", "cancelled")
        elif not kind and not killing:
            self._end(job, JobState.DONE, "", "")
        elif killing == "stall" or kind in PASSING:
            reason = "stalled" if killing == "stall" else kind
            if job.restarts >= self.max_restarts:
                self._end(
                    job,
                    JobState.FAILED,
                    reason,
                    message or f"{reason}: gave up after {job.restarts} restarts",
                )
            else:
                job.restarts += 1
                job.state = JobState.QUEUED
                job.not_before = now if killing == "stall" else now + self.retry_delay
                job.message = message or reason
        else:
            self._end(job, JobState.FAILED, kind, message)
        return self.tick(now)

    def cancel(self, key: Key, now: float) -> list[Action]:
        job = self.jobs.get(key)
        if job is None or job.state not in LIVE:
            return []
        if job.state is JobState.QUEUED:
            self._end(job, JobState.CANCELLED, "cancelled", "cancelled")
            return []
        if job.killing != "cancel":
            job.killing = "cancel"
            return [KillWorker(key, "cancel")]
        return []

    def forget(self, key: Key) -> None:
        """A finished job leaves the list (a new ask starts afresh)."""
        job = self.jobs.get(key)
        if job is not None and job.state not in LIVE:
            del self.jobs[key]

    def _end(self, job: Job, state: JobState, kind: str, message: str) -> None:
        job.state = state
        job.kind = kind
        job.message = message
        job.killing = ""
