"""The pull jobs' machine (``ktd.core.pulljob``): one job per repo and revision however
many ask, at most ``max_pulls`` running, stalls restarted then failed, passing errors
retried, the rest failed at once, cancels, the plan's refusal; and under hypothesis,
its invariants over any order of events and the clock."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ktd.core.pulljob import CheckFit, JobState, KillWorker, PullMachine, Start
from tests.hypo import budget

A = ("org/a", "main")
B = ("org/b", "main")


def running(m: PullMachine, key: tuple[str, str], now: float = 0.0) -> None:
    """Through the plan to the fetch."""
    assert m.planned(key, {"f": (100, 0)}, now) == [CheckFit(key)]
    assert m.checked(key, [], now) == [Start(key, "fetch", False)]


def test_asks_for_one_repo_share_one_job_and_the_bound_queues_the_rest() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=10)
    job, joined = m.ask(A, "a", 0.0)
    again, joined2 = m.ask(A, "alias-of-a", 0.0)
    assert job is again and not joined and joined2 and job.names == ["a", "alias-of-a"]
    m.ask(B, "b", 0.0)
    assert m.tick(0.0) == [Start(A, "plan", False)]
    assert m.jobs[B].state is JobState.QUEUED
    running(m, A)
    assert m.exited(A, "", "", 1.0) == [Start(B, "plan", False)]
    assert m.jobs[A].state is JobState.DONE


def test_a_stall_restarts_the_job_then_fails_it() -> None:
    m = PullMachine(max_pulls=2, stall_timeout=10, max_restarts=2)
    m.ask(A, "a", 0.0)
    m.tick(0.0)
    running(m, A)
    m.progress(A, "f", 10, 100, 5.0)
    assert m.tick(14.0) == []  # 9 s without a byte: not yet
    assert m.tick(15.5) == [KillWorker(A, "stall")]
    assert m.tick(16.0) == []  # one kill at a time
    assert m.exited(A, "died", "", 16.0) == [Start(A, "fetch", False)]  # resumed at once
    assert m.jobs[A].restarts == 1
    for restart in (2, 3):
        assert m.tick(100.0 * restart) == [KillWorker(A, "stall")]
        m.exited(A, "died", "", 100.0 * restart)
    assert m.jobs[A].state is JobState.FAILED and m.jobs[A].kind == "stalled"


def test_bytes_keep_a_job_alive_and_measure_its_rate() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=10)
    m.ask(A, "a", 0.0)
    m.tick(0.0)
    running(m, A)
    for t in range(1, 30):
        m.progress(A, "f", t * 3, 100, float(t))
        assert not m.tick(float(t) + 9)
    job = m.jobs[A]
    assert job.done == 87 and abs(job.rate - 3.0) < 1e-9 and job.eta is not None
    assert abs(job.eta - 13 / 3) < 1e-9


def test_passing_errors_retry_after_a_delay_others_fail_at_once() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=10, retry_delay=2)
    m.ask(A, "a", 0.0)
    m.tick(0.0)
    running(m, A)
    assert m.exited(A, "network", "reset", 1.0) == []
    assert m.jobs[A].state is JobState.QUEUED
    assert m.tick(2.0) == []
    assert m.tick(3.0) == [Start(A, "fetch", False)]
    for kind in ("gated", "missing", "disk", "checksum"):
        m.exited(A, kind, f"{kind}!", 4.0)
        assert m.jobs[A].state is JobState.FAILED and m.jobs[A].kind == kind
        m.forget(A)
        m.ask(A, "a", 4.0)
        m.tick(4.0)
        running(m, A, 4.0)


def test_the_plan_s_problems_refuse_unless_forced() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=10)
    m.ask(A, "a", 0.0)
    m.tick(0.0)
    m.planned(A, {"f": (100, 0)}, 0.0)
    m.checked(A, ["disk: 1 GiB short"], 0.0)
    assert m.jobs[A].state is JobState.FAILED and m.jobs[A].kind == "refused"
    m.ask(A, "a", 1.0, force=True)
    assert m.tick(1.0) == [Start(A, "plan", True)]
    m.planned(A, {"f": (100, 0)}, 1.0)
    assert m.checked(A, ["disk: 1 GiB short"], 1.0) == [Start(A, "fetch", True)]


def test_a_cancel_kills_a_running_job_and_drops_a_queued_one() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=10)
    m.ask(A, "a", 0.0)
    m.ask(B, "b", 0.0)
    m.tick(0.0)
    assert m.cancel(B, 0.0) == [] and m.jobs[B].state is JobState.CANCELLED
    assert m.cancel(A, 0.0) == [KillWorker(A, "cancel")]
    assert m.jobs[A].state is JobState.RUNNING  # until its worker is gone
    m.exited(A, "died", "", 1.0)
    assert m.jobs[A].state is JobState.CANCELLED
    assert m.cancel(A, 2.0) == []


class Jobs(RuleBasedStateMachine):
    """Any order of asks, plans, bytes, exits, cancels and the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.m = PullMachine(max_pulls=2, stall_timeout=5, max_restarts=2, retry_delay=1)
        self.now = 0.0
        self.workers: set[tuple[str, str]] = set()  # jobs with a worker started, not exited
        self.killed: set[tuple[str, str]] = set()

    def _do(self, actions: list[object]) -> None:
        for a in actions:
            if isinstance(a, Start):
                assert a.key not in self.workers, "two workers for one job"
                self.workers.add(a.key)
            elif isinstance(a, KillWorker):
                assert a.key in self.workers
                self.killed.add(a.key)

    keys = st.sampled_from([("org/a", "main"), ("org/b", "main"), ("org/c", "v1")])

    @rule(key=keys, name=st.sampled_from(["x", "y"]), force=st.booleans())
    def ask(self, key: tuple[str, str], name: str, force: bool) -> None:
        self.m.ask(key, name, self.now, force=force)

    @rule(dt=st.floats(0, 8))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._do(list(self.m.tick(self.now)))

    @rule(key=keys, done=st.integers(0, 100))
    def progress(self, key: tuple[str, str], done: int) -> None:
        if key in self.workers:
            self.m.progress(key, "f", done, 100, self.now)

    @rule(key=keys, problems=st.lists(st.just("disk"), max_size=1))
    def plan(self, key: tuple[str, str], problems: list[str]) -> None:
        job = self.m.jobs.get(key)
        planning = job is not None and job.phase == "plan"
        if key in self.workers and planning and key not in self.killed:
            self.workers.discard(key)  # the plan worker ends after its plan
            self.m.planned(key, {"f": (100, 0)}, self.now)
            self._do(list(self.m.checked(key, problems, self.now)))

    @rule(key=keys, kind=st.sampled_from(["", "network", "gated", "died", "checksum"]))
    def exit(self, key: tuple[str, str], kind: str) -> None:
        if key in self.workers:
            self.workers.discard(key)
            self.killed.discard(key)
            self._do(list(self.m.exited(key, kind, kind, self.now)))

    @rule(key=keys)
    def cancel(self, key: tuple[str, str]) -> None:
        self._do(list(self.m.cancel(key, self.now)))

    @invariant()
    def bounded(self) -> None:
        run = [j for j in self.m.jobs.values() if j.state is JobState.RUNNING]
        assert len(run) <= self.m.max_pulls

    @invariant()
    def a_worker_only_for_a_running_job(self) -> None:
        for key in self.workers:
            assert self.m.jobs[key].state is JobState.RUNNING

    @invariant()
    def restarts_bounded_and_failures_said(self) -> None:
        for job in self.m.jobs.values():
            assert job.restarts <= self.m.max_restarts
            if job.state is JobState.FAILED:
                assert job.kind and job.message


Jobs.TestCase.settings = budget(200, stateful_step_count=40, deadline=None)
test_jobs = Jobs.TestCase


def test_a_slow_fit_check_is_no_stall_of_the_fetch() -> None:
    m = PullMachine(max_pulls=1, stall_timeout=1)
    m.ask(A, "a", 0.0)
    m.tick(0.0)
    m.planned(A, {"f": (100, 0)}, 0.0)
    assert m.tick(5.0) == [KillWorker(A, "stall")]  # nothing to kill: the check runs in ktd
    assert m.checked(A, [], 6.0) == [Start(A, "fetch", False)]
    m.exited(A, "", "", 7.0)
    assert m.jobs[A].state is JobState.DONE
