"""The control API's engine operations: load, evict, sleep, wake, status, logs.

These are what ``ktctl`` (through ``ktd.daemon.dispatch``) asks of the engines, and they
only set desires on engines and wait for what the engines then do: one request's wait
and its answer. The pool (``ktd.daemon.pool.pool``) is the engines' registry and the host
they run in; it knows no request. The seam is the pool's public surface:
the control operations need nothing private of it. Operations raise
``ControlError`` (``ktd.control.errors``) with a stable code.
"""

from __future__ import annotations

import math
import time

import msgspec

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import loglines, sleepask
from ktd.core import states as S
from ktd.core.states import Step
from ktd.daemon.engine import kill, meminfo, memory
from ktd.daemon.engine.engine import Engine
from ktd.daemon.pool.pool import Pool, settled
from ktd.protocol import EngineInfo, ErrorCode, ModelInfo

#: ``keep_alive: 0``: the idle TTL that acts at once (the TTL's own 0 means never).
KEEP_ALIVE_NOW = 0.001


def _sglang_memory(figures: dict[str, float]) -> p.SglangMemory:
    return msgspec.convert(figures, p.SglangMemory, strict=False)


def _cannot_sleep(engine: Engine) -> sleepask.Refusal | None:
    label = engine.catalog.label if engine.catalog else None
    return sleepask.cannot_sleep(engine.alias, engine.sleep_mode(), label)


def _refuse(refusal: sleepask.Refusal | None) -> None:
    """Turn the request away when the rule did: its error, with its stable code."""
    if refusal is not None:
        raise ControlError(refusal.code, refusal.message, refusal.detail)


class Controls:
    """The control API's operations on the pool's engines (``Dispatch`` calls them)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def keep_alive(self, alias: str, seconds: float, *, forever: bool = False) -> str:
        """A client's idle TTL for ``alias``'s engine until it next stops (Ollama's
        ``keep_alive``): 0 sends it to sleep or stops it as soon as it is idle, by the TTL's
        own path (recalls, drain, sleep if it sleeps)."""
        engine = self.pool.engine(alias)
        if engine.state not in S.HAS_PROCESSES:
            return f"{alias} is not loaded"
        # The TTL's 0 means "never": an immediate expiry is the smallest TTL there is.
        engine.keep_alive = 0.0 if forever else max(seconds, KEEP_ALIVE_NOW)
        engine.notify_changed()
        if forever:
            return f"{alias} stays loaded until evicted"
        return f"{alias} goes when idle for {seconds:g}s"

    def status(self, alias: str | None = None) -> list[EngineInfo]:
        if alias is not None:
            infos = [self.pool.engine(alias).info(tail=20)]
        else:
            infos = [
                e.info(tail=20 if e.state == S.FAILED else 0) for e in self.pool.engines.values()
            ]
        for observer in self.pool.observers:
            for info in infos:
                observer.annotate(info)
        return infos

    def models(self) -> list[ModelInfo]:
        out = []
        for spec in self.pool.config.models.values():
            engine = self.pool.engines.get(spec.alias)
            out.append(
                ModelInfo(
                    alias=spec.alias,
                    backend=spec.backend,
                    served=spec.served,
                    path=spec.path,
                    state=engine.state if engine else "not served",
                    reason=engine.reason if engine else spec.not_served_reason,
                )
            )
        return out

    # ------------------------------------------------------------ load / evict / sleep

    async def load(
        self, alias: str, *, wait: bool = True, timeout: float | None = None
    ) -> EngineInfo:
        engine = self.pool.engine(alias)
        self.pool.check_open()
        if engine.state in (S.DRAINING, S.STOPPING):
            # An evict is under way: let it finish, then start afresh.
            await engine.wait_stopped()
        engine.request_up()
        if not wait:
            # Answer once the supervisor has taken the request, so the reply says "starting".
            await engine.wait_until(
                lambda: engine.state not in (S.STOPPED, S.FAILED) or not engine.want_up, 5.0
            )
            return engine.info()
        limit = math.inf if timeout is None or timeout <= 0 else timeout
        if not await engine.wait_until(engine.load_settled, limit):
            raise ControlError(
                ErrorCode.TIMEOUT,
                f"{alias} not ready after {limit:g}s (still {engine.state}; the load goes on)",
                {"state": engine.state},
            )
        return settled(engine)

    async def evict(
        self,
        alias: str | None,
        *,
        all: bool = False,
        force: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        if all:
            targets = list(self.pool.engines.values())
        elif alias is not None:
            targets = [self.pool.engine(alias)]
        else:
            raise ControlError(ErrorCode.BAD_REQUEST, "evict needs an alias or all=true")
        evicted = []
        asked: dict[str, tuple[int, int]] = {}
        for engine in targets:
            if engine.state in S.HAS_PROCESSES or engine.want_up:
                engine.request_down(force=force, drain_timeout=timeout)
                asked[engine.alias] = (engine.ups, engine.stops)
                evicted.append(engine.alias)
        overtaken = []
        for engine in (e for e in targets if e.alias in asked):
            # Ends when stopped, or when a load asked for it after this evict: that load
            # wins (it is answered ready), and this evict says so at once.
            if await self._stopped_or_overtaken(engine, *asked[engine.alias]):
                overtaken.append(engine.alias)
        if overtaken:
            raise ControlError(
                ErrorCode.BUSY,
                f"evict of {', '.join(overtaken)} overtaken by a load: still running",
                {"overtaken": overtaken},
            )
        return evicted

    @staticmethod
    async def _stopped_or_overtaken(engine: Engine, ups: int, stops: int) -> bool:
        """Wait until it stopped since the evict (``stops``), or a load asked for it after
        the evict (``ups``) before it began going down: that load wins. True when
        overtaken."""

        def stopped() -> bool:
            return engine.stops > stops or (
                engine.state in (S.STOPPED, S.FAILED) and not engine.want_up
            )

        def overtaken() -> bool:  # not on its way down: it serves on
            step = engine.phase.step if engine.phase else None
            going = engine.state in (S.DRAINING, S.STOPPING) or step == Step.DEREGISTERING
            return engine.ups > ups and not going

        await engine.wait_until(lambda: stopped() or overtaken())
        return not stopped()

    async def engine_memory(self, alias: str) -> p.EngineMemoryReply:
        """Where ``alias``'s memory is now: its processes on each GPU and NUMA node, and
        SGLang's own figures (``ktctl sleep --verify``)."""
        engine = self.pool.engine(alias)
        run = engine.run
        if run is None:
            raise ControlError(
                ErrorCode.NOT_LOADED, f"{alias} is {engine.state}: no process to measure"
            )
        pids = [pid for pid, _ in await self.pool.offload(kill.members, run)]
        gpu = await self.pool.offload(meminfo.gpu_use, pids)
        host = await self.pool.offload(meminfo.host_use, pids)
        figures = await memory.read_memory(self.pool.http, engine.url_for(run), key=run.api_key)
        residue = engine.gpu_residue or {}
        return p.EngineMemoryReply(
            alias=alias,
            state=engine.state,
            pid=run.pid,
            taken=time.time(),
            processes=len(pids),
            gpu=None if gpu is None else [p.GpuUse(gpu=i, bytes=b) for i, b in sorted(gpu.items())],
            gpu_note=None if gpu is not None else "nvidia-smi did not say (no NVIDIA GPU here?)",
            host=[p.NodeUse(node=n, bytes=b) for n, b in sorted(host.items())],
            sglang=None if figures is None else _sglang_memory(figures),
            residue=[p.GpuUse(gpu=i, bytes=b) for i, b in sorted(residue.items())],
            host_held=engine.host_bytes,
        )

    async def sleep(self, alias: str, *, timeout: float | None = None) -> EngineInfo:
        """Drain ``alias`` to zero, take it off the gateway, release its GPU memory.
        Answers once it is asleep (or, if the drain did not reach zero in time or the
        release failed, stopped, with why): the answers are ``ktd.core.sleepask``'s."""
        engine = self.pool.engine(alias)
        self.pool.check_open()
        _refuse(_cannot_sleep(engine))
        if sleepask.asleep_already(engine.state, engine.want_up):
            return engine.info()
        _refuse(sleepask.sleep_refused(alias, engine.state))
        engine.log.note("asked to sleep")
        engine.request_sleep(drain_timeout=timeout, reason="put to sleep")
        await engine.wait_until(lambda: sleepask.sleep_over(engine.state, engine.want))
        _refuse(sleepask.sleep_end(alias, engine.state, engine.want, engine.reason))
        return engine.info()

    async def wake(self, alias: str, *, timeout: float | None = None) -> EngineInfo:
        """Wake an asleep ``alias`` (a ready one: at once). Other states: a load."""
        engine = self.pool.engine(alias)
        self.pool.check_open()
        if sleepask.awake_already(engine.state, engine.want_up):
            return engine.info()
        _refuse(sleepask.wake_refused(alias, engine.state, _cannot_sleep(engine)))
        return await self.load(alias, timeout=timeout)

    def logs(self, alias: str, lines: int, *, probes: bool = False) -> tuple[list[str], int]:
        """The last ``lines`` lines (ktd's own health-check access lines only if
        ``probes``), and the log's line count when they were read (``LogsReply.upto``)."""
        engine = self.pool.engine(alias)
        engine.log.poll()
        n = max(0, min(lines, 100_000))
        if probes:
            return engine.log.last(n), engine.log.count
        keep = [ln for ln in engine.log.tail if not loglines.is_probe_access(ln)]
        return (keep[-n:] if n else []), engine.log.count
