"""The daemon's pool in-process, for tests: the real ``Pool`` (its supervisors, the gate,
the placer, the sweeper, the claim table) on trio's virtual clock, its engines adopted
from stand-in processes or launched as such (``StandIn``, the pool's injected
``Launcher``), and SGLang's HTTP played by ``FakeSGLang`` through httpx's
``MockTransport``.

Each engine's process is a real one (a ``sleep`` in a session of its own, carrying the
engine's marker), so the supervisor's exit watch and the stop sequence act on a real
process tree; its HTTP side is a fake that keeps SGLang's rules as ``docs/sglang.md``
states them and records every breach instead of dying: a release while a request runs
(SGLang asserts and takes the server down), a generation that reaches a released
engine's scheduler (on a GPU it would run on freed memory), a resume of memory that is
not released. The fake's requests are visible to ``/v1/loads`` only once their prefill
has ended (SGLang publishes its load snapshot after a prefill, not before).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

from ktd.core import states as S
from ktd.core.command import ENGINE_MARK
from ktd.core.config import Config, ConfigFile, DaemonSection, ModelSpec
from ktd.core.exits import Outcome
from ktd.daemon.engine import proctree
from ktd.daemon.engine.engine import Engine
from ktd.daemon.engine.launcher import FollowLog, placed
from ktd.daemon.engine.running import Running
from ktd.daemon.pool.persist import FixedPlacement
from ktd.daemon.pool.pool import Pool
from tests.daemon.inprocess import inline
from tests.fixtures.specs import kt_spec
from tests.fixtures.topology import ONE_NODE

SAVER = ("--enable-memory-saver", "--enable-weights-cpu-backup")


@dataclass
class Call:
    """One of SGLang's memory or fence calls as the fake met it."""

    path: str
    at: float
    released: bool


@dataclass
class FakeSGLang:
    """One engine's SGLang, as its HTTP routes behave (``docs/sglang.md``, "Sleep").

    ``release_time``/``resume_time``: seconds each call takes (a callable: a new value
    each call, so a test can make them slow, fast or varied). ``prefill``: seconds a
    request is invisible to ``/v1/loads``."""

    alias: str
    release_time: Callable[[], float] = lambda: 0.05
    resume_time: Callable[[], float] = lambda: 0.05
    prefill: float = 0.0
    ready_at: float = 0.0  # a launched engine's load: not ready (503) before this time
    released: bool = False
    paused: bool = False  # /pause_generation: new requests wait at the tokenizer
    scheduler: set[int] = field(default_factory=set)  # requests the scheduler holds
    visible_at: dict[int, float] = field(default_factory=dict)
    breaches: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    served: int = 0
    _next: int = 0
    _unpaused: trio.Event = field(default_factory=trio.Event)
    _aborted: set[int] = field(default_factory=set)

    def _breach(self, what: str) -> None:
        self.breaches.append(f"{self.alias}: {what} at {trio.current_time():.2f}")

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/v1/models", "/health") and trio.current_time() < self.ready_at:
            return httpx.Response(503)  # still loading
        if path in ("/release_memory_occupation", "/resume_memory_occupation"):
            self.calls.append(Call(path, trio.current_time(), self.released))
            return await (self._release() if "release" in path else self._resume())
        if path == "/pause_generation":
            self.calls.append(Call(path, trio.current_time(), self.released))
            return await self._pause(json.loads(request.content or b"{}"))
        if path == "/continue_generation":
            self.calls.append(Call(path, trio.current_time(), self.released))
            self.paused = False
            self._unpaused.set()
            return httpx.Response(200, json={"message": "ok", "status": "ok"})
        if path == "/flush_cache":
            ok = not self.scheduler
            return httpx.Response(200 if ok else 400, text="Cache flushed.\n")
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.alias}]})
        if path == "/v1/loads":
            return httpx.Response(200, json={"loads": [self._load()]})
        if path in ("/health", "/health_generate", "/generate"):
            hold = float(request.headers.get("x-hold", "0"))
            return await self._generate(hold, health=path != "/generate")
        return httpx.Response(404, json={"detail": "Not Found"})

    def _load(self) -> dict[str, Any]:
        now = trio.current_time()
        seen = [r for r in self.scheduler if self.visible_at.get(r, math.inf) <= now]
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(seen),
            "num_waiting_reqs": 0,
            "num_used_tokens": 16 * len(seen),
        }

    async def _generate(self, hold: float, *, health: bool) -> httpx.Response:
        if self.paused:  # the tokenizer holds it before it reaches the scheduler
            with trio.move_on_after(20 if health else math.inf):
                await self._unpaused.wait()
            if self.paused:
                return httpx.Response(503)  # /health gives up after its timeout
        if self.released:
            self._breach("a generation reached the scheduler while released")
            return httpx.Response(500)
        rid = self._next = self._next + 1
        self.scheduler.add(rid)
        self.visible_at[rid] = trio.current_time() + self.prefill
        try:
            await trio.sleep(max(hold, 0.01))
        finally:
            self.scheduler.discard(rid)
            self.visible_at.pop(rid, None)
        if rid in self._aborted:
            self._aborted.discard(rid)
            return httpx.Response(200, json={"meta_info": {"finish_reason": "abort"}})
        self.served += 0 if health else 1
        return httpx.Response(200, json={"text": "x"})

    async def _pause(self, body: dict[str, Any]) -> httpx.Response:
        self.paused = True
        self._unpaused = trio.Event()
        if body.get("mode", "abort") == "abort":
            self._aborted |= self.scheduler
        return httpx.Response(200, json={"message": "Generation paused successfully."})

    async def _release(self) -> httpx.Response:
        if self.scheduler:
            self._breach(f"release with {len(self.scheduler)} request(s) in the scheduler")
        if self.released:
            self._breach("release of memory already released")
        await trio.sleep(self.release_time())
        self.released = True
        return httpx.Response(200, json=None)

    async def _resume(self) -> httpx.Response:
        if not self.released:
            self._breach("resume of memory that is not released")
        await trio.sleep(self.resume_time())
        self.released = False
        return httpx.Response(200, json=None)


@dataclass
class World:
    """A pool in-process with its fake engines; ``holders()`` is checked at every change."""

    pool: Pool
    fakes: dict[str, FakeSGLang]
    procs: list[trio.Process] = field(default_factory=list)
    breaches: list[str] = field(default_factory=list)
    started: bool = False
    launcher: StandIn | None = None  # the pool's: it launches stopped engines

    def engine(self, alias: str) -> Engine:
        return self.pool.engines[alias]

    def problems(self) -> list[str]:
        return self.breaches + [b for f in self.fakes.values() for b in f.breaches]

    def check(self) -> None:
        if not self.started:
            return  # adopted engines show "adopting" until their supervisors take over
        held: dict[str, list[str]] = {}
        for alias, e in self.pool.engines.items():
            # What the pool counts as held (``holds_resources``), but for an asleep
            # engine on its way down: its SGLang holds no GPU memory any more.
            plan, fake = e.plan, self.fakes.get(alias)
            down_asleep = e.state == S.STOPPING and fake is not None and fake.released
            if plan is not None and e.holds_resources() and not down_asleep:
                parts = [f"node {n}" for n in plan.numa_nodes] + [f"GPU {g}" for g in plan.gpus]
                for part in parts:
                    held.setdefault(part, []).append(alias)
        for part, holders in held.items():
            if len(holders) > 1:
                self.breaches.append(f"{' and '.join(holders)} awake on {part} at once")

    async def use(self, alias: str, hold: float, *, timeout: float) -> str:
        """A client's lease on ``alias``, one request of ``hold`` seconds on the engine,
        the lease given back: "ok", or the error code it met."""
        from ktd.control.errors import ControlError

        try:
            lease, e = await self.pool.acquire(alias, f"client-{alias}", timeout=timeout)
        except ControlError as exc:
            return exc.code
        try:
            assert e.url is not None
            r = await self.pool.http.post(
                e.url + "/generate",
                json={"text": "hi"},
                headers={"x-hold": str(hold)},
                timeout=None,
            )
            return "ok" if r.status_code == 200 else f"http {r.status_code}"
        finally:
            self.pool.release(lease)


async def _spawn(marker: str) -> trio.Process:
    """A stand-in engine process: real, in a session of its own, carrying the marker."""
    env = {**os.environ, ENGINE_MARK: marker}
    return await trio.lowlevel.open_process(
        ["sleep", "100000"], env=env, start_new_session=True, stdin=subprocess.DEVNULL
    )


async def _stand_in(w: World, alias: str, port: int, **run: Any) -> Running:
    """A stand-in process for ``alias`` on ``port`` (the fake's address), as a ``Running``."""
    marker = f"{w.pool.instance}/{alias}@{port}"
    proc = await _spawn(marker)
    w.procs.append(proc)
    stat = proctree.read_stat(proc.pid)
    assert stat is not None
    argv = ["python", "-m", "sglang.launch_server", *SAVER]
    return Running(
        pid=proc.pid,
        start=stat.start,
        engine_id=marker,
        port=port,
        argv=argv,
        proc=proc,
        sleeps=True,
        api_key="engine-key-of-the-test",
        **run,
    )


@dataclass
class StandIn:
    """The pool's launcher in-process: the real placement (``launcher.placed``, the
    pool's placer: it may evict or put others to sleep), then a stand-in process and a
    fresh ``FakeSGLang`` on a port of its own, which answers as loading for
    ``load_time()`` virtual seconds (the probe, preflight and SGLang's command are the
    process launcher's, tested with real processes elsewhere)."""

    fakes: Callable[[str], FakeSGLang]
    load_time: Callable[[], float] = lambda: 0.0
    world: World | None = None
    launches: list[str] = field(default_factory=list)
    _port: int = 31000

    async def launch(self, e: Engine, follow_log: FollowLog) -> Running | Outcome:
        w = self.world
        assert w is not None
        refused = await placed(e)
        if refused is not None:
            return refused
        self._port += 1
        old = w.fakes.get(e.alias)
        if old is not None:
            w.breaches += old.breaches  # the last run's record stays
        fake = w.fakes[e.alias] = self.fakes(e.alias)
        fake.ready_at = trio.current_time() + self.load_time()
        self.launches.append(e.alias)
        return await _stand_in(w, e.alias, self._port, digest=e.spec.launch_digest())


def _dying(proc: trio.Process) -> bool:
    """A stand-in (``sleep``, always asleep in the kernel while it lives) that was
    signalled and is not reaped yet: a signal pending, on its way out, or a zombie."""
    if proc.returncode is not None:
        return False
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "").split()[:1]
    pending = any(int(fields.get(k, "0").strip() or "0", 16) for k in ("SigPnd", "ShdPnd"))
    return pending or state != ["S"]


#: Real seconds of idleness before the virtual clock jumps while a stand-in dies (a
#: bound, not a wait: the exit's event ends it; a process that never dies costs this).
DYING = 0.25


class _RealWaits(trio.abc.Instrument):
    """No virtual time passes while a stand-in process dies. The pool waits for a real
    exit (a pidfd, a reap); on an autojumping clock with nothing else runnable, every
    periodic deadline (health checks, polls) would be jumped through meanwhile, hundreds
    of virtual seconds in a real millisecond, and a request's bound met by no fault of
    the pool's (a test failed 4 runs in 10 so). While one dies the clock jumps only
    after ``DYING`` real seconds with nothing to run: the exit comes first."""

    def __init__(self, procs: list[trio.Process]) -> None:
        self.procs = procs

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        clock = trio.lowlevel.current_clock()
        if isinstance(clock, trio.testing.MockClock) and clock.rate == 0:
            clock.autojump_threshold = DYING if any(map(_dying, self.procs)) else 0.0


@asynccontextmanager
async def world(
    tmp: Path,
    engines: Iterable[tuple[str, S.State]],
    *,
    fakes: Callable[[str], FakeSGLang] = FakeSGLang,
    load_time: Callable[[], float] = lambda: 0.0,
    **daemon: Any,
) -> AsyncIterator[World]:
    """A running pool whose sleep-enabled engines on one node were adopted in ``state``
    (ready or asleep), or are stopped (``S.STOPPED``: launched by ``StandIn`` when
    wanted, loading for ``load_time()``). Leaves no process behind."""
    settings = {"health_interval": 5.0, "hang_timeout": 30.0, "lease_ttl": 1e6, **daemon}
    specs: dict[str, ModelSpec] = {}
    wanted = list(engines)
    for alias, _ in wanted:
        specs[alias] = kt_spec(alias=alias, sleep=True, fit="ignore", numa=[0], port=0)
    config = Config(
        path=str(tmp / "config.json"),
        file=ConfigFile(daemon=DaemonSection(**settings)),
        models=specs,
    )
    launcher = StandIn(fakes, load_time)
    pool = Pool(
        config, log_dir=tmp, publish=lambda topic, ev: w.check(), offload=inline, launcher=launcher
    )
    w = launcher.world = World(pool, {}, launcher=launcher)
    w.pool.refresh_topology(ONE_NODE)
    port = 30000
    for alias, state in wanted:
        port += 1
        if state == S.STOPPED:
            continue
        fake = w.fakes[alias] = fakes(alias)
        fake.released = fake.paused = state == S.ASLEEP
        e = w.engine(alias)
        e.begin_adoption(await _stand_in(w, alias, port, adopted_state=state))
        e.plan = FixedPlacement(numa_nodes=(0,), cpus=(0, 1, 2, 3), gpus=(0,), env={})

    async def route(request: httpx.Request) -> httpx.Response:
        for alias, fake in w.fakes.items():
            run = w.engine(alias).run
            if run is not None and run.port == request.url.port:
                return await fake.handle(request)
        raise httpx.ConnectError("connection refused", request=request)

    w.pool.http = httpx.AsyncClient(transport=httpx.MockTransport(route))
    guard = _RealWaits(w.procs)
    trio.lowlevel.add_instrument(guard)
    try:
        async with trio.open_nursery() as n:
            await n.start(w.pool.run)
            await trio.testing.wait_all_tasks_blocked()
            w.started = True
            yield w
            await w.pool.stop_all(force=True)
            n.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(guard)
        for proc in w.procs:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await proc.wait()
