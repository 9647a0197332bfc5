"""Shared fixtures: real daemons on real ipc sockets, sim engines, and the leak check.

Every process a test starts inherits ``KTD_TEST_RUN`` (set below), so the
autouse leak check can find any survivor by its environment, whatever session
or parent it escaped to. A test that leaves one fails, and the survivor is killed.
Processes a module shares (``tests/stack.py``) carry ``RUN_ID/shared`` instead: the
per-test check leaves them alone, and the module's own check fails the module if one
outlives it.

``tests/README.md`` says how to run the suite, what each part costs, and the patterns
new tests follow (one daemon per module, waits on events, short timeouts in config).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket as socketlib
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tests.hypo  # noqa: F401  (the hypothesis profiles: registered before collection)
from ktd.daemon.engine import proctree

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "ktd" / "sim" / "shim"
MARK = "KTD_TEST_RUN"
# One id per pytest process: under xdist each worker checks (and kills) only
# what it started itself, never its sibling's engines.
RUN_ID = f"{uuid.uuid4().hex}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
#: The marker of processes a whole module shares (``tests/stack.py``).
SHARED = f"{RUN_ID}/shared"
#: The marker of what one pytest process shares across modules (the dashboard's Chromium):
#: checked once, when the session ends.
SESSION = f"{RUN_ID}/session"
os.environ[MARK] = RUN_ID
#: ``stack_factory``: one daemon (and frontend) shared by a module's tests.
pytest_plugins = ("tests.stack",)
# Nothing in the tests may talk to a daemon of the machine's own.
for _var in ("KTD_SOCKET", "KTD_CONFIG", "KTD_RUNTIME_DIR", "KTD_STATE_DIR", "NOTIFY_SOCKET"):
    os.environ.pop(_var, None)


def marked_processes(*, shared: bool = False, session: bool = False) -> list[tuple[int, list[str]]]:
    """Live processes of this test run, except pytest itself and its ancestors: those of
    the tests (``RUN_ID``), with ``shared`` those of the modules' shared stacks too, and
    with ``session`` also those the whole session shares (``SESSION``)."""
    values = {RUN_ID, SHARED, SESSION} if session else {RUN_ID, SHARED} if shared else {RUN_ID}
    me = os.getpid()
    ancestors = {me}
    info = proctree.read_stat(me)
    while info is not None and info.ppid > 1:
        ancestors.add(info.ppid)
        info = proctree.read_stat(info.ppid)
    out = []
    for pid, value in proctree.marked(MARK).items():
        if value not in values or pid in ancestors:
            continue
        info = proctree.read_stat(pid)
        if info is None or info.state in ("Z", "X"):
            continue
        out.append((pid, proctree.cmdline(pid)))
    return out


def engine_auth(port: int | None) -> dict[str, str]:
    """``Authorization`` for the engine of this test run listening on ``port``: every engine
    answers 401 without its key (issue 32), which is in the 0600 file its command line
    names (``--config``; the tests run as ktd's own user)."""
    from ktd.daemon.engine.key import auth_headers, key_of_argv

    for _pid, cmd in marked_processes(shared=True):
        if "--port" in cmd[:-1] and cmd[cmd.index("--port") + 1] == str(port):
            return auth_headers(key_of_argv(cmd)[0])
    return {}


def kill_marked(*, shared: bool = False, session: bool = False) -> None:
    for pid, _ in marked_processes(shared=shared, session=session):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fail_on_leaks(what: str, grace: float, *, shared: bool = False, session: bool = False) -> None:
    """Fail ``what`` (and kill the survivors) if a process of this run outlives ``grace``
    (with ``shared``: the modules' shared processes count too; with ``session``: all)."""
    deadline = time.monotonic() + grace
    left = marked_processes(shared=shared, session=session)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = marked_processes(shared=shared, session=session)
    if left:
        kill_marked(shared=shared, session=session)
        lines = "\n".join(f"  pid {pid}: {' '.join(cmd)[:200]}" for pid, cmd in left)
        pytest.fail(f"{what} leaked {len(left)} process(es):\n{lines}", pytrace=False)


# ---------------------------------------------------------------- the e2e marker and the run

#: Fixtures that start real processes (daemons, frontends, sims, the router, a browser):
#: a test that uses one (directly or through another fixture) is marked ``e2e``.
E2E_FIXTURES = frozenset(
    {
        "ktd_env",
        "daemon_factory",
        "frontend_factory",
        "sim_factory",
        "stack_factory",
        "hosts",
        "router",
        "box_factory",
        "browser",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``e2e`` what starts real processes, so ``-m "not e2e"`` is the fast loop: by
    its fixtures, by its module's name (``*_e2e.py``), or everything under
    ``tests/reliability`` (processes, faults and state machines over a live daemon).
    A test that starts processes by itself says so with ``pytest.mark.e2e``."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            continue
        path = Path(str(item.fspath))
        if (
            E2E_FIXTURES & set(getattr(item, "fixturenames", ()))
            or path.stem.endswith("_e2e")
            or "reliability" in path.parts
        ):
            item.add_marker(pytest.mark.e2e)


def pytest_configure(config: pytest.Config) -> None:
    """Compile ``ktd`` and ``ktctl`` once for the whole run, on the controller, and
    keep the rewritten test modules.

    Every daemon, frontend and sim a test starts imports ~150 modules of this tree; where
    Python does not write bytecode (``PYTHONDONTWRITEBYTECODE``, as in some sandboxes)
    each of those processes compiled them all again (0.15 s of CPU per start, some 13% of
    the suite's CPU). Compiled here into ``__pycache__`` (git ignores it), they are read
    as any installed package's are; a file changed later is seen as stale by its mtime
    and compiled again in memory. Without the variable Python writes them itself at the
    first start and this finds nothing to do.
    """
    if not sys.dont_write_bytecode:
        return
    if not hasattr(config, "workerinput"):
        import compileall

        for package in ("ktd", "ktctl"):
            compileall.compile_dir(REPO / package, quiet=2, workers=1)
    # pytest's assertion rewriting of the test modules (4-5 s of CPU for each xdist
    # worker at every run) is cached in ``__pycache__`` the same way, but only where
    # bytecode may be written: this process (not the ones it starts) writes it.
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fails the test if any process it started (engines above all) is still alive after it."""
    yield
    fail_on_leaks("test", 5.0)


#: The TLS context of the harness's HTTP clients (``httpx.get(url, verify=TLS)``): httpx
#: builds one per client otherwise, loading the CA bundle (23 ms of CPU each), and the
#: harness polls with many short-lived clients. They all speak plain HTTP on loopback.
TLS = ssl.create_default_context()

#: How often a wait on events looks again anyway, for what no event announces.
RECHECK = 0.2


@pytest.fixture(scope="module")
def shared_marker() -> Iterator[str]:
    """The leak-check marker for processes a module starts once and shares among its
    tests (``SHARED``: the per-test check leaves them alone). The module fails if one of
    them outlives the fixtures that asked for it (torn down before this one)."""
    yield SHARED
    fail_on_leaks("module's shared processes", 10.0, shared=True)


@pytest.fixture(scope="session")
def session_marker() -> Iterator[str]:
    """The leak-check marker for processes one pytest process shares across modules
    (``SESSION``: the per-test and per-module checks leave them alone). The session fails
    if one of them outlives the fixtures that asked for it."""
    yield SESSION
    fail_on_leaks("session's shared processes", 10.0, session=True)


def wait_for(pred: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy; that value is returned.

    For a daemon's engine, ``DaemonProc.wait_engine`` waits on its events instead.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- environment and config


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """Short path: an ipc socket path must stay under ~107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="ktd-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def own_env() -> dict[str, str]:
    """This process's environment without the caller's own KT*, SGLANG* and
    CUDA_VISIBLE_DEVICES, the marker of the leak check excepted.

    The engines a test starts see what ktd gives them, and the sims record it:
    a variable of the shell that ran pytest (``KTD_REAL_CACHE`` from the README's
    test command, a ``CUDA_VISIBLE_DEVICES``) must not reach them.
    """
    from ktd.sim.record import selected_env

    inherited = selected_env(os.environ).keys() - {MARK}
    return {k: v for k, v in os.environ.items() if k not in inherited}


@pytest.fixture
def ktd_env(tmp_path: Path, runtime_dir: Path) -> dict[str, str]:
    env = own_env()
    env["KTD_RUNTIME_DIR"] = str(runtime_dir / "run")
    env["KTD_STATE_DIR"] = str(tmp_path / "state")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("KTD_SOCKET", None)
    return env


#: Stand-in model dirs (config.json + a small weight file) shared by this test run:
#: preflight refuses paths that do not exist.
SIM_MODELS = Path(tempfile.gettempdir()) / f"ktd-sim-models-{RUN_ID}"


def sim_paths(alias: str) -> tuple[str, str]:
    """(model_path, kt_weight_path) of a stand-in model that exists on disk."""
    from ktd.sim.model import make_model

    return make_model(SIM_MODELS, alias)


@pytest.fixture(scope="session", autouse=True)
def _sim_models_cleanup() -> Iterator[None]:
    yield
    shutil.rmtree(SIM_MODELS, ignore_errors=True)


#: The sim's own phases, short: a load of 0.05 s and a warm-up of 0.02 s (the sim's
#: defaults, 0.3 and 0.1, were paid by every load of the suite). A test that needs a
#: load it can watch sets ``KTD_SIM_LOAD_TIME`` itself.
SIM_TIMES = {"KTD_SIM_LOAD_TIME": "0.05", "KTD_SIM_WARMUP": "0.02"}


def sim_model(alias: str, *, record: Path | None = None, **knobs: Any) -> dict[str, Any]:
    """A models.json entry whose engine is the sim, launched through the sglang shim."""
    env = {
        "PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))),
        **SIM_TIMES,
    }
    env.update({k: str(v) for k, v in knobs.pop("env", {}).items()})
    if record is not None:
        env["KTD_SIM_RECORD"] = str(record)
    model_path, weights = sim_paths(alias)
    entry: dict[str, Any] = {
        "path": model_path,
        "backend": "kt",
        "alias": alias,
        "numa": "none",  # this box has one NUMA node; tests of placement set numa explicitly
        "kt": {"extra_env": env, "kt_weight_path": weights},
    }
    kt_over = knobs.pop("kt", {})
    entry["kt"].update(kt_over)
    entry.update(knobs)
    return entry


#: The daemon's timeouts for a test that waits on them: a hang seen in ~1 s, a stop's
#: grace and a drain of 2 s, a crash restarted after 0.1 s, leases that expire after
#: 1.5 s. (``ConfigWriter``'s defaults are the milder ones every test gets.)
FAST_DAEMON: dict[str, Any] = {
    "stop_grace": 2,
    "drain_timeout": 2,
    "health_interval": 0.2,
    "hang_timeout": 1,
    "restart_backoff": 0.1,
    "lease_ttl": 1.5,
}


@dataclass
class ConfigWriter:
    root: Path

    def __call__(
        self,
        models: list[dict[str, Any]],
        *,
        ktransformers: dict[str, Any] | None = None,
        daemon: dict[str, Any] | None = None,
        frontend: dict[str, Any] | None = None,
    ) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, Any] = {
            "ktransformers": ktransformers or {},
            "models_file": "models.json",
            "daemon": {"stop_grace": 5, "drain_timeout": 5, "health_interval": 1, **(daemon or {})},
            "frontend": frontend or {},
        }
        (self.root / "models.json").write_text(json.dumps(models, indent=2))
        path = self.root / "config.json"
        path.write_text(json.dumps(cfg, indent=2))
        return path


@pytest.fixture
def write_config(tmp_path: Path) -> ConfigWriter:
    return ConfigWriter(tmp_path / "etc")


# ---------------------------------------------------------------- a real daemon


@dataclass
class DaemonProc:
    config: Path
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    # systemd's notify socket the daemon says READY=1 on once it serves (abstract: no file).
    _ready: socketlib.socket | None = field(default=None, repr=False)

    @property
    def socket(self) -> Path:
        return Path(self.env["KTD_RUNTIME_DIR"]) / "control.sock"

    def start(self, *, wait: bool = True) -> DaemonProc:
        env = self.env
        self._close_ready()
        if "NOTIFY_SOCKET" not in env:  # a test of the notify protocol brings its own
            name = f"ktd-test-{uuid.uuid4().hex}"
            self._ready = socketlib.socket(
                socketlib.AF_UNIX, socketlib.SOCK_DGRAM | socketlib.SOCK_CLOEXEC
            )
            self._ready.bind("\0" + name)
            env = {**env, "NOTIFY_SOCKET": "@" + name}
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ktd", "serve", "--config", str(self.config), *self.extra_args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def _close_ready(self) -> None:
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until the daemon answers a ping: first its READY=1 on the notify socket (the
        event that says it serves), then the ping that proves it."""
        from ktctl import Client, DaemonUnreachable

        deadline = time.monotonic() + timeout
        while self._ready is not None and (left := deadline - time.monotonic()) > 0:
            assert self.proc is not None
            if self.proc.poll() is not None:
                self._close_ready()
                raise AssertionError(f"ktd exited {self.proc.returncode}:\n{self.output()}")
            readable = select.select([self._ready], [], [], min(left, 0.1))[0]
            if readable and b"READY=1" in self._ready.recv(4096).split(b"\n"):
                self._close_ready()
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"ktd exited {self.proc.returncode}:\n{self.output()}")
            if self.socket.exists():
                try:
                    with Client(self.socket, timeout=1.0) as c:
                        c.ping()
                    return
                except DaemonUnreachable:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"ktd did not come up in {timeout}s:\n{self.output()}")

    def client(self, timeout: float = 10.0) -> Any:
        from ktctl import Client

        return Client(self.socket, timeout=timeout)

    def status_doc(self) -> dict[str, Any]:
        """What ``ktctl status --json`` prints, through the client library: tests poll status
        in loops, and a ``ktctl`` process per poll cost a Python start-up each (the CLI's
        own output is tested in tests/ktctl and tests/test_exports.py)."""
        import msgspec

        with self.client(timeout=30) as c:
            reply = c.status_reply(None)
        doc: dict[str, Any] = {"engines": msgspec.to_builtins(reply.engines)}
        if reply.gateway is not None:
            doc["gateway"] = msgspec.to_builtins(reply.gateway)
        return doc

    def engines(self) -> dict[str, dict[str, Any]]:
        """``status_doc()``'s engines by alias."""
        return {e["alias"]: e for e in self.status_doc()["engines"]}

    def wait_engine(
        self,
        alias: str,
        pred: Any,
        *,
        timeout: float = 15.0,
        what: str | None = None,
    ) -> dict[str, Any]:
        """Wait until ``pred(engine)`` holds for ``alias``'s entry of ``engines()``; it is
        returned. Checked at once, then again on each of the engine's events (its state,
        its phase, its count in flight: ``engine.<alias>``, ``lease.<alias>``), and every
        ``RECHECK`` seconds for what no event announces (``claims``, ``expires_at``).

        The subscription is made before the first check, so a change between the check
        and the wait is not missed; the bound is ``timeout`` as with ``wait_for``.
        """
        deadline = time.monotonic() + timeout
        with self.client() as c:
            sub = c.subscribe([f"engine.{alias}", f"lease.{alias}"], exact=True)
            while True:
                e = self.engines().get(alias)
                if e is not None and pred(e):
                    return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout:g}s waiting for {what or 'a condition'}"
                        f" on {alias}: {e}"
                    )
                if sub.get(min(left, RECHECK)) is not None:
                    sub.drain()  # a burst of events is one more look

    def wait_recorded(self, alias: str, pid: int | None = None, timeout: float = 10.0) -> None:
        """Wait until the daemon's state file (``engines.json``) records ``alias``'s engine
        (with ``pid``, if given): what a test must see before it kills the daemon and
        expects the next one to adopt the engine. (The record is written a moment after the
        state changes; a fixed sleep before ``kill -9`` was a guess at that moment.)"""
        from ktd.daemon.pool import statefile

        path = Path(self.env["KTD_STATE_DIR"]) / "engines.json"

        def recorded() -> bool:
            engines = statefile.read(path).engines
            return any(r.alias == alias and pid in (None, r.pid) for r in engines)

        wait_for(recorded, timeout=timeout, what=f"{alias} (pid {pid}) in {path}")

    def wait_state(self, alias: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
        """``wait_engine`` for ``alias`` to be in one of ``states``."""
        return self.wait_engine(
            alias, lambda e: e["state"] in states, timeout=timeout, what=f"state in {states}"
        )

    def ktctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ktctl", "--socket", str(self.socket), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self._close_ready()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"ktd ignored {sig} for {timeout}s:\n{self.output()}"
                ) from None
        return self.proc.returncode


@pytest.fixture
def daemon_factory(tmp_path: Path, ktd_env: dict[str, str]) -> Iterator[Any]:
    started: list[DaemonProc] = []

    def make(config: Path, *, start: bool = True, env: dict[str, str] | None = None) -> DaemonProc:
        d = DaemonProc(
            config=config,
            env=env or ktd_env,
            log_path=tmp_path / f"ktd-{len(started)}.log",
        )
        started.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
