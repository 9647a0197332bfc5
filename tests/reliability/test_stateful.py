"""A model-based test: random sequences of operations and faults against ONE real daemon.

Hypothesis drives a ``RuleBasedStateMachine`` over a live ``ktd serve`` with two
sim models: load (waiting or not), evict, force-evict, crash (SIGKILL of the
engine's process group), hang (SIGUSR1), hot reload with a changed ``ctx``,
acquire+release, acquire by a client that then dies (its leases must expire
after ``lease_ttl``), and ``kill -9`` of the daemon itself followed by a new
``ktd serve`` that re-adopts the engines. After every step, once things settle,
the daemon's view must equal the process table:

* an engine whose status has a pid: that process is alive and leads its own session;
  ``ready``/``draining`` always have a pid, ``stopped``/``failed`` never;
* every live process carrying this run's ``KTD_ENGINE`` marker belongs to the session
  of the engine of the same alias that status shows (nothing runs unrecorded);
* the leases in status are exactly those held (plus dying clients' not yet expired);
* no port an engine ever used is still listening once status says it is stopped;
* a ready, idle engine runs the ``ctx`` the config says (reload restarts happened);
* an engine is ``stopped``/``failed`` right after its evict returns (nothing resurrects it).

``KTD_TEST_TRACE=1`` (with ``-s``) prints every step and the status after it.

The daemon is started once per test; each example begins from "everything evicted,
original config", and ends with no engine process left.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ktctl import Client, KtdError
from ktd.daemon.engine import proctree
from tests.conftest import ConfigWriter, sim_model

from ._util import (
    FAST_DAEMON,
    engine_procs,
    kill_group,
    listening_ports,
    run_against_daemon,
    wait_for,
)

ALIASES = ("sm-a", "sm-b")
BASE_CTX = 4096
LEASE_TTL = 1.0
# Everything the daemon may legitimately still be doing after a step has to settle
# within this: a hang is detected after health_interval + hang_timeout, a drain
# takes drain_timeout, a restart restart_backoff + a sim start.
SETTLE = 15.0
DAEMON = {
    **FAST_DAEMON,
    "lease_ttl": LEASE_TTL,
    "drain_timeout": 1,
    "restart_max": 50,
    "restart_window": 600,
}
TRACE = bool(os.environ.get("KTD_TEST_TRACE"))  # print every step (debugging aid)
# Errors an operation may legitimately get in a random sequence (and their reasons).
EXPECTED = {"load_failed", "busy", "timeout", "not_loaded"}


def models(ctx: dict[str, int]) -> list[dict[str, Any]]:
    # health_timeout bounds how long an engine that hung while ktd was down stays
    # "starting" after re-adoption (see test_faults: known bug, xfail).
    return [sim_model(a, kt={"ctx": ctx[a]}, health_timeout=8) for a in ALIASES]


class Harness:
    """The one daemon all examples share, and the config writer for reloads."""

    def __init__(self, d: Any, writer: ConfigWriter) -> None:
        self.d = d
        self.writer = writer
        self.hb_client = "sm-live"
        self._stop = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat, daemon=True)
        self._hb.start()

    def _heartbeat(self) -> None:
        """The live client's heartbeats (a frontend sends them while it holds leases)."""
        c: Client | None = None
        while not self._stop.wait(0.2):
            try:
                if c is None:
                    c = self.d.client(timeout=2)
                c.heartbeat(self.hb_client)
            except Exception:
                if c is not None:
                    c.close()
                c = None  # the daemon is being restarted: try again
        if c is not None:
            c.close()

    def close(self) -> None:
        self._stop.set()
        self._hb.join(5)

    def write(self, ctx: dict[str, int]) -> None:
        self.writer(models(ctx), daemon=DAEMON)


class DaemonMachine(RuleBasedStateMachine):
    harness: Harness  # set by the test before running
    # Leases held by others than this machine (a frontend's in-flight requests): at most.
    other_leases = 0

    def __init__(self) -> None:
        super().__init__()
        self.h = type(self).harness
        self.c: Client = self.h.d.client(timeout=20)
        self.ctx = {a: BASE_CTX for a in ALIASES}
        self.live: dict[str, str] = {}  # lease -> alias, held by the heartbeating client
        self.dying: list[tuple[float, str]] = []  # (acquired at, lease) of dead clients
        self.ports: dict[str, set[int]] = {a: set() for a in ALIASES}
        self.dead_ids = itertools.count()
        self.last = "start"
        self.adopted: dict[str, int | None] = {}  # alias -> pid adopted by a restarted daemon

    # ------------------------------------------------------------ helpers

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except KtdError as exc:
            assert exc.code in EXPECTED, f"{fn.__name__}{args}: {exc}"
            return None

    def trace(self) -> None:
        if TRACE:
            view = [(e.alias, e.state, e.pid, e.in_flight) for e in self.c.status()]
            print(f"{time.monotonic():9.2f} {self.last:40} {view}", flush=True)

    def engine(self, alias: str) -> Any:
        return self.c.status(alias)[0]

    # ------------------------------------------------------------ setup

    @initialize()
    def reset(self) -> None:
        """Every example starts from: nothing running, no leases, the original config."""
        self.c.evict(all=True, force=True)
        self.h.write(self.ctx)
        self.c.reload()
        wait_for(
            lambda: sum(e.in_flight for e in self.c.status()) == 0,
            timeout=10,
            what="leases of an earlier example to expire",
        )
        wait_for(lambda: not engine_procs(), timeout=10, what="a clean start")

    # ------------------------------------------------------------ operations

    @rule(alias=st.sampled_from(ALIASES))
    def load(self, alias: str) -> None:
        self.last = f"load {alias}"
        info = self.call(self.c.load, alias, timeout=20)
        if info is not None:
            assert info.state == "ready" and info.pid

    @rule(alias=st.sampled_from(ALIASES))
    def load_no_wait(self, alias: str) -> None:
        self.last = f"load_no_wait {alias}"
        self.call(self.c.load, alias, wait=False)

    @rule(alias=st.sampled_from(ALIASES), force=st.booleans())
    def evict(self, alias: str, force: bool) -> None:
        self.last = f"evict {alias} {force}"
        self.c.evict(alias, force=force)
        e = self.engine(alias)
        # Nothing brings it back by itself: not a pending reload restart, not a crash restart.
        assert e.state in ("stopped", "failed"), e

    @rule(alias=st.sampled_from(ALIASES))
    def crash(self, alias: str) -> None:
        self.last = f"crash {alias}"
        pid = self.engine(alias).pid
        if pid:
            kill_group(pid)

    @rule(alias=st.sampled_from(ALIASES))
    def hang(self, alias: str) -> None:
        self.last = f"hang {alias}"
        pid = self.engine(alias).pid
        if pid:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    @rule(alias=st.sampled_from(ALIASES), ctx=st.sampled_from([2048, 4096, 8192]))
    def reload_with_new_ctx(self, alias: str, ctx: int) -> None:
        self.last = f"reload_with_new_ctx {alias} {ctx}"
        self.ctx[alias] = ctx
        self.h.write(self.ctx)
        self.c.reload()

    @rule(alias=st.sampled_from(ALIASES))
    def acquire_and_release(self, alias: str) -> None:
        self.last = f"acquire_and_release {alias}"
        got = self.call(self.c.acquire, alias, self.h.hb_client, timeout=20)
        if got is not None:
            assert got.alias == alias and got.url.startswith("http://")
            self.c.release(got.lease)

    @rule(alias=st.sampled_from(ALIASES))
    def acquire_and_hold(self, alias: str) -> None:
        self.last = f"acquire_and_hold {alias}"
        got = self.call(self.c.acquire, alias, self.h.hb_client, timeout=20)
        if got is not None:
            self.live[got.lease] = alias

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        self.last = "release_held"
        lease = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[lease]
        self.c.release(lease)

    @rule(alias=st.sampled_from(ALIASES))
    def acquire_then_client_dies(self, alias: str) -> None:
        self.last = f"acquire_then_client_dies {alias}"
        client = f"sm-dead-{next(self.dead_ids)}"
        got = self.call(self.c.acquire, alias, client, timeout=20)
        if got is not None:
            self.dying.append((time.monotonic(), got.lease))

    @rule()
    def daemon_kill9_and_restart(self) -> None:
        """``kill -9 ktd`` and start it again: engines are re-adopted, leases are gone."""
        self.last = "daemon_kill9_and_restart"
        d = self.h.d
        self.c.close()
        d.proc.kill()
        d.proc.wait()
        d.start()
        self.c = d.client(timeout=20)
        self.adopted = {e.alias: e.pid for e in self.c.status() if e.pid}
        self.live.clear()
        self.dying.clear()

    # ------------------------------------------------------------ invariants

    @invariant()
    def daemon_view_equals_process_table(self) -> None:
        d = self.h.d
        assert d.proc.poll() is None, f"ktd died (exit {d.proc.returncode}):\n{d.output()}"
        deadline = time.monotonic() + SETTLE
        while True:
            problems = self._problems()
            if not problems:
                self.trace()
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    "daemon and process table disagree:\n  "
                    + "\n  ".join(problems)
                    + f"\nstatus: {self.c.status()}\nengine processes: {engine_procs()}"
                )
            time.sleep(0.05)

    def _problems(self) -> list[str]:
        problems: list[str] = []
        status = {e.alias: e for e in self.c.status()}
        procs = engine_procs()
        listening = listening_ports()
        owners: dict[int, str] = {}
        for alias, e in status.items():
            if e.port is not None:
                self.ports[alias].add(e.port)
            if e.state in ("ready", "draining") and e.pid is None:
                problems.append(f"{alias} is {e.state} without a pid")
            if e.state in ("stopped", "failed") and e.pid is not None:
                problems.append(f"{alias} is {e.state} with pid {e.pid}")
            if e.pid is None:
                continue
            owners[e.pid] = alias
            info = proctree.read_stat(e.pid)
            if info is None or info.state in ("Z", "X"):
                problems.append(f"{alias}: pid {e.pid} in status is not alive")
            elif info.sid != e.pid:
                problems.append(f"{alias}: pid {e.pid} is not a session leader (sid {info.sid})")
        for pid, mark in procs.items():
            info = proctree.read_stat(pid)
            if info is None or info.state in ("Z", "X"):
                continue
            alias = mark.rsplit("/", 1)[-1].split("@", 1)[0]
            if owners.get(info.sid) != alias:
                problems.append(f"engine process {pid} ({mark}) has no record in status")
        for alias, e in status.items():
            # A ready, idle engine runs the configured launch (a reload restarted it), unless
            # it is one a restarted daemon adopted (see test_faults: adoption keeps the argv).
            if e.state == "ready" and not e.in_flight and self.adopted.get(alias) != e.pid:
                ctx = e.argv[e.argv.index("--context-length") + 1]
                if ctx != str(self.ctx[alias]):
                    problems.append(f"{alias} runs ctx {ctx}, config says {self.ctx[alias]}")
        held = {e.port for e in status.values() if e.pid is not None}
        for alias, e in status.items():
            if e.state in ("stopped", "failed"):
                still = (self.ports[alias] - held) & listening
                if still:
                    problems.append(f"{alias} is {e.state} but its port(s) {still} listen")
        total = sum(e.in_flight for e in status.values())
        now = time.monotonic()
        # A dead client's lease lives at most lease_ttl plus one sweep (ttl/3) after its
        # last heartbeat (sent with the acquire); one more second for slack.
        self.dying = [(t, lease) for t, lease in self.dying if now - t < LEASE_TTL * 1.34 + 1.0]
        if not len(self.live) <= total <= len(self.live) + len(self.dying) + self.other_leases:
            problems.append(
                f"status counts {total} lease(s); held {len(self.live)} live, "
                f"{len(self.dying)} of dead clients not yet due to expire"
            )
        return problems

    def teardown(self) -> None:
        try:
            for lease in list(self.live):
                self.c.release(lease)
            self.live.clear()
            self.c.evict(all=True, force=True)
            wait_for(lambda: not engine_procs(), timeout=10, what="no engine left")
            assert all(e.state in ("stopped", "failed") for e in self.c.status())
        finally:
            self.c.close()


def run_machine(write_config: ConfigWriter, daemon_factory: Any, examples: int, steps: int) -> None:
    write_config(models({a: BASE_CTX for a in ALIASES}), daemon=DAEMON)
    d = daemon_factory(write_config.root / "config.json")
    harness = Harness(d, write_config)
    DaemonMachine.harness = harness
    try:
        run_against_daemon(DaemonMachine, d, examples, steps)
    finally:
        harness.close()


@pytest.mark.timeout(300)  # few, slow steps: the decisions themselves are tested in tests/core by
# thousands of steps of the pure machines; this one drives what only processes show
def test_daemon_state_machine(write_config: ConfigWriter, daemon_factory: Any) -> None:
    run_machine(write_config, daemon_factory, examples=5, steps=12)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_daemon_state_machine_soak(write_config: ConfigWriter, daemon_factory: Any) -> None:
    run_machine(write_config, daemon_factory, examples=40, steps=30)
