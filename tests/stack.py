"""One real daemon (and frontend) shared by the end-to-end tests of a module.

Starting ``ktd serve`` + ``ktd frontend`` and loading a sim costs a test about a second
and a half of a busy 2-core box; a module of tests that do not disturb each other pays
it once. A module declares its stack with a module-scoped fixture and gets it reset
before each test through a function-scoped one::

    @pytest.fixture(scope="module")
    def shared(stack_factory: StackFactory) -> Stack:
        return stack_factory([sim_model("m1"), sim_model("m2")], frontend={"api_keys": ["k"]})

    @pytest.fixture
    def stack(shared: Stack) -> Stack:
        return shared.reset()

``reset()`` goes through the public API only: the module's own config is written back
and reloaded if a test changed it, every engine is evicted (drained, its claims
recalled from the frontend, stopped) and waited for until no engine process of the
stack is left. What a test may then not assume: counters that outlive an evict
(``loads``, ``stops``, the usage ledger, the frontend's metrics); compare with the
value before the test's own action, or use ``daemon_factory`` for a daemon of its own.

A test that kills, restarts, pauses or corrupts the daemon or the frontend, or needs a
config the daemon reads only at start, uses ``daemon_factory``/``frontend_factory``.
``reset()`` refuses to go on with a stack whose processes died (the module's later
tests fail with the reason, instead of running against something else).

Processes of a stack carry ``tests.conftest.SHARED`` as their leak-check marker: the
per-test check ignores them, and the module fails if one outlives the module's stack.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from tests.conftest import (
    MARK,
    REPO,
    SHARED,
    ConfigWriter,
    DaemonProc,
    marked_processes,
    own_env,
    wait_for,
)


@dataclass
class Stack:
    """A module's daemon and (optional) frontend on one config."""

    daemon: DaemonProc
    writer: ConfigWriter
    models: list[dict[str, Any]]
    sections: dict[str, Any]
    frontend: Any = None  # tests.frontend.conftest.FrontendProc, with_frontend=True
    _changed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        assert self.frontend is not None, "this stack has no frontend"
        return str(self.frontend.url)

    def write(self, models: list[dict[str, Any]] | None = None, **sections: Any) -> Path:
        """Write a config of the test's own (``models``, and sections replacing the
        module's); ``reset()`` writes the module's back. Reload it yourself."""
        self._changed = True
        merged = {**self.sections, **sections}
        return self.writer(self.models if models is None else models, **merged)

    def engine_pids(self) -> set[int]:
        """Live engine processes of this stack (anything with ktd's engine marker)."""
        return {
            pid
            for pid, _ in marked_processes(shared=True)
            if proctree.environ_get(pid, MARK) == SHARED and proctree.environ_has(pid, ENGINE_MARK)
        }

    def check_alive(self) -> None:
        assert self.daemon.proc is not None and self.daemon.proc.poll() is None, (
            f"the module's daemon died (a test that kills it needs its own):\n"
            f"{self.daemon.output()}"
        )
        if self.frontend is not None:
            assert self.frontend.proc.poll() is None, (
                f"the module's frontend died (a test that kills it needs its own):\n"
                f"{self.frontend.output()}"
            )

    def reset(self, timeout: float = 30.0) -> Stack:
        """Back to the module's config with every engine stopped (see the module doc)."""
        self.check_alive()
        with self.daemon.client(timeout=timeout) as c:
            if self._changed:
                self.writer(self.models, **self.sections)
                c.reload()
                self._changed = False
            c.evict(all=True)
        wait_for(
            lambda: all(
                e["state"] in ("stopped", "failed") for e in self.daemon.engines().values()
            ),
            timeout=timeout,
            what="every engine of the module's daemon stopped",
        )
        wait_for(lambda: not self.engine_pids(), timeout=timeout, what="no engine process left")
        return self

    def stop(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()


StackFactory = Callable[..., Stack]


@pytest.fixture(scope="module")
def stack_factory(
    tmp_path_factory: pytest.TempPathFactory, shared_marker: str
) -> Iterator[StackFactory]:
    """``stack_factory(models, daemon=..., frontend=..., with_frontend=True, env=...)`` → a
    started ``Stack`` for the module (``env``: more variables for its processes, e.g. a
    fixture machine's ``KTD_SYSFS_ROOT``); stopped after the module's last test, then the module's
    leak check (its daemon, frontend and every engine they started must be gone)."""
    from tests.frontend.conftest import launch_frontend

    made: list[Stack] = []
    dirs: list[Path] = []

    def make(
        models: list[dict[str, Any]],
        *,
        daemon: dict[str, Any] | None = None,
        frontend: dict[str, Any] | None = None,
        with_frontend: bool = True,
        env: dict[str, str] | None = None,
    ) -> Stack:
        env_more = env
        root = tmp_path_factory.mktemp("stack")
        run = Path(tempfile.mkdtemp(prefix="ktd-", dir="/tmp"))  # short: an ipc path
        dirs.append(run)
        env = own_env()
        env[MARK] = shared_marker
        env["KTD_RUNTIME_DIR"] = str(run / "run")
        env["KTD_STATE_DIR"] = str(root / "state")
        env["PYTHONPATH"] = str(REPO)
        env.update(env_more or {})
        writer = ConfigWriter(root / "etc")
        sections = {"daemon": daemon, "frontend": frontend}
        cfg = writer(models, **sections)
        d = DaemonProc(config=cfg, env=env, log_path=root / "ktd.log")
        stack = Stack(daemon=d, writer=writer, models=models, sections=sections)
        made.append(stack)
        d.start()
        if with_frontend:
            stack.frontend = launch_frontend(cfg, env, root / "frontend.log")
        return stack

    yield make
    for stack in made:
        stack.stop()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
