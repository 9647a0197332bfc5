"""The random chaos run with the real fault mix (issue 12): the state machine of
``test_stateful`` plus a real frontend carrying streaming traffic, and the faults an
operator's box really sees:

* ``kill -9`` of an engine's group, of its scheduler child alone, of the daemon (then a
  restart), of the frontend (then a restart);
* SIGSTOP of an engine (short, and long enough to be judged hung) and of the daemon;
* hot reloads with a changed launch;
* ``kill -9`` of the daemon followed by a lost, truncated or forged state file.

On top of ``test_stateful``'s invariants (the daemon's view equals the process table,
no engine unrecorded, no port left listening, leases accounted for):

* no lost claim: every engine ready before a daemon restart is ready after it on the
  same pid, whatever happened to the state file meanwhile;
* no killed foreign process: a foreign session (``sleep`` + a child), which forged state
  records name, is alive after every step;
* no leak: at the end no engine process, and (the autouse check) no process of the run.

``test_chaos_soak`` is the long variant (``-m slow``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from ktd.daemon.engine import proctree
from ktd.daemon.pool import statefile
from tests.conftest import ConfigWriter, sim_model
from tests.hypo import budget

from . import test_stateful as base
from ._util import alive, engine_procs, session_of, wait_for

TRAFFIC_THREADS = 2
# hang_timeout 1.5: a short SIGSTOP (0.3 s) is survived, a long one (2 s) is a hang. (Were
# 3 and 4 s: the same cases, a hang seen and a long stop served in half the time.)
DAEMON = {**base.DAEMON, "hang_timeout": 1.5}
FRONTEND = {"autoload": False}  # evict must stay an evict: traffic never reloads a model


def chaos_models(ctx: dict[str, int]) -> list[dict[str, Any]]:
    return [
        sim_model(a, kt={"ctx": ctx[a]}, health_timeout=8, env={"KTD_SIM_TOKEN_RATE": "40"})
        for a in base.ALIASES
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Frontend:
    """A real ``ktd frontend`` process on a port of its own."""

    def __init__(self, config: Path, env: dict[str, str], log_path: Path) -> None:
        self.config = config
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ktd",
                    "frontend",
                    "--config",
                    str(self.config),
                    "--bind",
                    f"127.0.0.1:{port}",
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code < 600
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=20, what="the frontend to listen")
        self.url = url

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()


class ChaosHarness(base.Harness):
    def __init__(self, d: Any, writer: ConfigWriter, tmp_path: Path) -> None:
        super().__init__(d, writer)
        self.foreign = subprocess.Popen(
            ["sh", "-c", "sleep 3600 & exec sleep 3600"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        self.foreign_session: set[int] = wait_for(
            lambda: len(session_of(self.foreign.pid)) == 2 and session_of(self.foreign.pid),
            what="the foreign session",
        )
        self.fe = Frontend(writer.root / "config.json", d.env, tmp_path / "frontend.log")
        self.fe.start()
        self.traffic: Counter[str] = Counter()
        self._stop_traffic = threading.Event()
        self._threads = [
            threading.Thread(target=self._stream, args=(i,), daemon=True)
            for i in range(TRAFFIC_THREADS)
        ]
        for t in self._threads:
            t.start()

    def write(self, ctx: dict[str, int]) -> None:
        self.writer(chaos_models(ctx), daemon=DAEMON, frontend=FRONTEND)

    def _stream(self, n: int) -> None:
        """Streaming chat through the frontend, all the time; any outcome is counted."""
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(trust_env=False, timeout=10) as http:
            for i in itertools.count():
                if self._stop_traffic.is_set():
                    return
                alias = base.ALIASES[(i + n) % len(base.ALIASES)]
                try:
                    with http.stream(
                        "POST", f"{self.fe.url}/v1/chat/completions", json={**body, "model": alias}
                    ) as r:
                        chunks = []
                        for chunk in r.iter_bytes():
                            chunks.append(chunk)
                            # A stream waiting for a model nobody loads (autoload off) is
                            # kept alive by ``: loading`` lines: it must not hold the stop.
                            if self._stop_traffic.is_set():
                                break
                        data = b"".join(chunks)
                    done = r.status_code == 200 and b"[DONE]" in data
                    self.traffic["stream-ok" if done else f"http-{r.status_code}"] += 1
                except httpx.HTTPError as exc:
                    self.traffic[type(exc).__name__] += 1
                time.sleep(0.02)

    def close(self) -> None:
        self._stop_traffic.set()
        for t in self._threads:
            t.join(15)
        self.fe.kill()
        super().close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.foreign.pid, signal.SIGKILL)
        self.foreign.wait()


class ChaosMachine(base.DaemonMachine):
    harness: ChaosHarness  # type: ignore[assignment]
    # The frontend's in-flight streams, and a killed frontend's not yet expired.
    other_leases = 2 * TRAFFIC_THREADS

    def __init__(self) -> None:
        super().__init__()
        # Engine pids a fault condemned (hung, stopped past hang_timeout, scheduler killed):
        # their restart is right, so they are no claims a restarted daemon must keep.
        self.doomed: set[int] = set()

    @property
    def ch(self) -> ChaosHarness:
        return type(self).harness

    def _pid(self, alias: str) -> int | None:
        pid: int | None = self.engine(alias).pid
        return pid

    # ------------------------------------------------------------ more faults

    @rule(alias=st.sampled_from(base.ALIASES))
    def hang(self, alias: str) -> None:
        """As the base rule; a hung engine is no claim a restarted daemon must keep (it is
        killed and restarted once its health deadline passes, as it should be)."""
        pid = self._pid(alias)
        super().hang(alias)
        if pid:
            self.doomed.add(pid)

    @rule(alias=st.sampled_from(base.ALIASES))
    def kill_scheduler_child(self, alias: str) -> None:
        """What the OOM killer does: only the scheduler (the biggest process) dies."""
        self.last = f"kill_scheduler_child {alias}"
        pid = self._pid(alias)
        if pid:
            self.doomed.add(pid)  # the server exits once it sees its scheduler gone
            children = [p for p in proctree.descendants(pid) if p.state not in ("Z", "X")]
            if children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(min(c.pid for c in children), signal.SIGKILL)

    @rule(alias=st.sampled_from(base.ALIASES), secs=st.sampled_from([0.3, 2.0]))
    def sigstop_engine(self, alias: str, secs: float) -> None:
        self.last = f"sigstop_engine {alias} {secs}"
        pid = self._pid(alias)
        if pid:
            if secs > DAEMON["hang_timeout"]:
                self.doomed.add(pid)  # may be judged hung (rightly) around the SIGCONT
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                time.sleep(secs)
                os.kill(pid, signal.SIGCONT)

    @rule()
    def sigstop_daemon(self) -> None:
        """Shorter than lease_ttl minus a heartbeat: no live lease may expire of it."""
        self.last = "sigstop_daemon"
        d = self.h.d
        os.kill(d.proc.pid, signal.SIGSTOP)
        time.sleep(0.4)
        os.kill(d.proc.pid, signal.SIGCONT)

    @rule()
    def frontend_kill9_and_restart(self) -> None:
        """Its leases must expire (lease_ttl) and its streams' engines stay up."""
        self.last = "frontend_kill9_and_restart"
        self.ch.fe.kill()
        self.ch.fe.start()

    @rule()
    def daemon_kill9_and_restart(self) -> None:
        ready = self._ready_pids()
        super().daemon_kill9_and_restart()
        self._no_lost_claim(ready)

    @rule(how=st.sampled_from(["delete", "truncate", "forge"]))
    def daemon_kill9_and_lose_the_record(self, how: str) -> None:
        """A state file lost (ENOSPC, an operator), cut short, or forged to name the foreign
        session: every engine is still re-adopted, the foreign session never signalled."""
        self.last = f"daemon_kill9_and_lose_the_record {how}"
        ready = self._ready_pids()
        d = self.h.d
        self.c.close()
        d.proc.kill()
        d.proc.wait()
        state_dir = Path(d.env["KTD_STATE_DIR"])
        path = state_dir / "engines.json"
        if how == "delete":
            path.unlink(missing_ok=True)
        elif how == "truncate" and path.exists():
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        elif how == "forge":
            instance = statefile.instance_key(state_dir)
            f = self.ch.foreign
            info = proctree.read_stat(f.pid)
            assert info is not None
            forged = [
                statefile.EngineRecord(
                    alias=a,
                    pid=f.pid,
                    start=info.start,
                    engine_id=f"{instance}/{a}@1",
                    port=1,
                    argv=proctree.cmdline(f.pid),
                    state="ready",
                )
                for a in base.ALIASES
            ]
            statefile.write(path, statefile.StateFile(engines=forged))
        d.start()
        self.c = d.client(timeout=20)
        self.adopted = {e.alias: e.pid for e in self.c.status() if e.pid}
        self.live.clear()
        self.dying.clear()
        self._no_lost_claim(ready)

    # ------------------------------------------------------------ checks

    def _ready_pids(self) -> dict[str, int]:
        """Engines a restarted daemon must keep: ready ones, except those due for a restart
        by design (a reload changed their launch: ``stale``, or a ctx other than the
        config's, which a restarted daemon also restarts once idle)."""
        return {
            e.alias: e.pid
            for e in self.c.status()
            if e.state == "ready"
            and e.pid
            and e.pid not in self.doomed
            and not e.stale
            and e.argv[e.argv.index("--context-length") + 1] == str(self.ctx[e.alias])
        }

    def _no_lost_claim(self, ready: dict[str, int]) -> None:
        for alias, pid in ready.items():

            def same(alias: str = alias, pid: int = pid) -> bool:
                [e] = self.c.status(alias)
                return e.state == "ready" and e.pid == pid

            wait_for(
                same,
                timeout=base.SETTLE,
                what=f"{alias} (pid {pid}) to be re-adopted, not lost or restarted",
            )
        self.adopted = {e.alias: e.pid for e in self.c.status() if e.pid}

    @invariant()
    def foreign_session_untouched(self) -> None:
        dead = [pid for pid in self.ch.foreign_session if not alive(pid)]
        assert not dead, f"foreign process(es) {dead} were killed"


def run_chaos(
    write_config: ConfigWriter,
    daemon_factory: Any,
    tmp_path: Path,
    examples: int,
    steps: int,
    *,
    shrink: bool = True,
) -> Counter[str]:
    write_config(
        chaos_models({a: base.BASE_CTX for a in base.ALIASES}), daemon=DAEMON, frontend=FRONTEND
    )
    d = daemon_factory(write_config.root / "config.json")
    harness = ChaosHarness(d, write_config, tmp_path)
    ChaosMachine.harness = harness
    try:
        run_state_machine_as_test(
            ChaosMachine,
            settings=budget(
                examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                # A soak reports its failing sequence as found: shrinking a sequence of
                # real process faults can take longer than the soak itself.
                phases=list(Phase) if shrink else [Phase.explicit, Phase.generate],
            ),
        )
        assert d.proc.poll() is None, d.output()
        with d.client() as c:
            c.evict(all=True, force=True)
            wait_for(
                lambda: sum(e.in_flight for e in c.status()) == 0,
                timeout=10,
                what="every lease released or expired",
            )
        assert all(alive(pid) for pid in harness.foreign_session)
    finally:
        traffic = harness.traffic
        harness.close()
    log = d.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
    assert engine_procs() == {}
    print(f"chaos traffic outcomes: {dict(traffic)}")
    return traffic


@pytest.mark.timeout(600)
def test_chaos_state_machine(
    write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path
) -> None:
    run_chaos(write_config, daemon_factory, tmp_path, examples=2, steps=8)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chaos_soak(write_config: ConfigWriter, daemon_factory: Any, tmp_path: Path) -> None:
    traffic = run_chaos(write_config, daemon_factory, tmp_path, examples=25, steps=30, shrink=False)
    assert traffic["stream-ok"] > 0, traffic
