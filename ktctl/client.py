"""Synchronous client for ktd's control API: the library behind ``ktctl``.

Why synchronous pyzmq and not the daemon's trio client: ``ktctl`` must start in
well under 100 ms and local tools (scripts, notebooks, cron jobs) should not need
an event loop to ask "is my model loaded?". So this module imports only zmq,
msgspec, the standard library and the light ``ktd.protocol``/``ktd.paths``.

The connection itself (reachability, a request and its reply, events) and the errors
are ``ktctl.connection``'s; this module is the operations, one method each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any, Literal, overload

from ktctl.connection import (
    Connection,
    ConnectionLost,
    DaemonUnreachable,
    KtctlError,
    KtdError,
    ProtocolError,
)
from ktctl.connection import probe as probe
from ktctl.connection import resolve_socket as resolve_socket
from ktctl.events import POLL_SLICE, Subscription
from ktd import protocol as p
from ktd.core.loglines import Seam

__all__ = [
    "Client",
    "ConnectionLost",
    "DaemonUnreachable",
    "KtctlError",
    "KtdError",
    "ProtocolError",
    "Subscription",
]

DRY_RUN_BUDGET = 130.0  # seconds: the daemon's engine probe is bounded at 120 s
MACHINE_BUDGET = 20.0  # seconds: the daemon runs nvidia-smi, bounded at 15 s


def _author(author: str | None) -> str:
    """Who the change is by, as this client says it (the daemon reads the uid itself)."""
    if author is not None:
        return author[:128]
    try:
        import getpass

        return getpass.getuser()[:128]
    except (ImportError, KeyError, OSError):
        return ""


# ---------------------------------------------------------------- client


class Client(Connection):
    """The Python API of ktd for local tools: one synchronous connection to the daemon.

    Every method sends one request and waits for its reply. Error replies raise
    ``KtdError`` (match on ``.code``: ``unknown_model``, ``not_kt``,
    ``load_failed``, ``busy``, ``timeout``, ...); a daemon that is not running or
    does not answer within ``timeout`` seconds raises ``DaemonUnreachable``.
    Long operations (a ``load`` that waits for readiness) are not bounded by
    ``timeout``: they wait for the daemon, which enforces its own deadlines, and
    fail at once with ``DaemonUnreachable`` if the daemon goes away meanwhile.

    ``socket`` is the control socket path (``ipc://`` prefix optional); default
    ``$KTD_SOCKET``, else ``$KTD_RUNTIME_DIR/control.sock``. The events socket is
    ``events.sock`` beside it. Not thread-safe: use one Client per thread.

    Example::

        from ktctl import Client, KtdError

        with Client() as ktd:
            engine = ktd.load("deepseek-v4-kt")          # waits until ready
            print(engine.url, engine.pid)
            for e in ktd.status():
                print(e.alias, e.state, e.in_flight)
            try:
                ktd.evict("deepseek-v4-kt", timeout=60)
            except KtdError as exc:
                print("evict failed:", exc.code, exc.message)
    """

    # ------------------------------------------------------------ operations

    def ping(self) -> p.Pong:
        """The daemon's version and pid, its protocol and features: the cheapest proof
        it is alive and answering. A daemon of protocol 1.0 names no features; it has
        ``FEATURES_1_0``, filled in here so that a feature test works on it too."""
        pong = self._expect(self._call(p.Ping(), self.timeout), p.Pong)
        if pong.protocol == p.PROTOCOL_1_0 and not pong.features:
            pong.features = list(p.FEATURES_1_0)
        return pong

    def status(self, alias: str | None = None) -> list[p.EngineInfo]:
        """Every engine ktd knows (or just ``alias``; unknown aliases raise ``unknown_model``)."""
        return self._expect(self._call(p.Status(alias=alias), self.timeout), p.StatusReply).engines

    def status_reply(self, alias: str | None = None) -> p.StatusReply:
        """``status`` with the daemon-wide parts too (``gateway``: the routers ktd syncs with)."""
        return self._expect(self._call(p.Status(alias=alias), self.timeout), p.StatusReply)

    def models(self) -> list[p.ModelInfo]:
        """Every models.json entry, including those of other backends (``served`` False)."""
        return self._expect(self._call(p.Models(), self.timeout), p.ModelsReply).models

    @overload
    def load(
        self,
        alias: str,
        *,
        wait: bool = ...,
        timeout: float | None = ...,
        dry_run: Literal[False] = ...,
        progress: Callable[[p.Event | None], None] | None = ...,
    ) -> p.EngineInfo: ...

    @overload
    def load(
        self,
        alias: str,
        *,
        wait: bool = ...,
        timeout: float | None = ...,
        dry_run: Literal[True],
        progress: Callable[[p.Event | None], None] | None = ...,
    ) -> dict[str, Any]: ...

    @overload
    def load(
        self,
        alias: str,
        *,
        wait: bool = ...,
        timeout: float | None = ...,
        dry_run: bool,
        progress: Callable[[p.Event | None], None] | None = ...,
    ) -> p.EngineInfo | dict[str, Any]: ...

    def load(
        self,
        alias: str,
        *,
        wait: bool = True,
        timeout: float | None = None,
        dry_run: bool = False,
        progress: Callable[[p.Event | None], None] | None = None,
    ) -> p.EngineInfo | dict[str, Any]:
        """Start ``alias`` (no-op if running) and return its EngineInfo.

        ``wait=True`` returns once the engine is ready; with ``timeout=None``
        there is no overall limit, because big models take many minutes and the
        daemon applies the model's own health deadline. Check ``.state`` of the
        result: a load can end ``failed`` (``.reason``, ``.log_tail``) if the
        daemon reports it that way rather than as a ``load_failed`` error.
        ``dry_run=True`` returns the launch plan (argv, env, NUMA nodes, CPUs,
        GPUs, flags and their origin, engines it would evict) and starts nothing.
        ``progress`` receives the alias's ``engine.``/``log.`` events while
        waiting (subscribed before the request is sent, so none is missed), and
        None a few times a second so a display can refresh its clock.
        """
        msg = p.Load(alias=alias, wait=wait, timeout=timeout, dry_run=dry_run)
        if dry_run:
            # The daemon probes the engine's Python first if it has not yet (importing a
            # real SGLang takes tens of seconds; ktd bounds its probe at 120 s).
            budget = timeout if timeout else max(self.timeout, DRY_RUN_BUDGET)
            return self._expect(self._call(msg, budget), p.PlanReply).plan
        budget = self._long(timeout) if wait else self.timeout
        if progress is None or not wait:
            return self._expect(self._call(msg, budget), p.LoadReply).engine
        return self._watched(msg, alias, budget, progress)

    def _watched(
        self,
        msg: p.Request,
        alias: str,
        budget: float,
        progress: Callable[[p.Event | None], None] | None,
    ) -> p.EngineInfo:
        """Send ``msg`` (answered by a ``LoadReply``), passing ``alias``'s ``engine.``/``log.``
        events to ``progress`` while waiting (subscribed before the request is sent)."""
        if progress is None:
            return self._expect(self._call(msg, budget), p.LoadReply).engine
        sub: Subscription | None
        try:
            sub = self.subscribe([f"engine.{alias}", f"log.{alias}"], exact=True)
        except DaemonUnreachable:
            sub = None  # no events socket: still wait, the display just ticks
        try:
            reply = self._call(msg, budget, sub=sub, on_event=progress)
        finally:
            if sub is not None:
                sub.close()
        return self._expect(reply, p.LoadReply).engine

    def evict(
        self,
        alias: str | None = None,
        *,
        all: bool = False,
        force: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        """Stop ``alias`` (or every engine with ``all=True``); returns the evicted aliases.

        Draining waits for in-flight requests (bounded by ``timeout`` or the
        daemon's default); ``force=True`` skips the drain.
        """
        if (alias is None) == (not all):
            raise ValueError("evict needs exactly one of alias or all=True")
        msg = p.Evict(alias=alias, all=all, force=force, timeout=timeout)
        return self._expect(self._call(msg, self._long(timeout)), p.EvictReply).evicted

    def sleep(
        self,
        alias: str,
        *,
        timeout: float | None = None,
        progress: Callable[[p.Event | None], None] | None = None,
    ) -> p.EngineInfo:
        """Put ``alias`` to sleep and return its EngineInfo (``state`` ``asleep``).

        The engine is drained (in-flight requests finish; ``timeout`` bounds the
        drain, else the daemon's ``drain_timeout``), taken off the gateway, and
        SGLang releases its GPU memory; the process lives on and its experts stay
        in host RAM, so ``wake`` is much faster than a load. An engine already
        asleep is answered at once. Raises ``KtdError`` with code ``no_sleep``
        (the model is not configured with ``"sleep": true``, or its SGLang lacks
        ``--enable-memory-saver``; the message says which), ``not_loaded`` (not
        running), ``unknown_model``, ``timeout`` or ``busy``. ``progress`` is as
        for ``load``.
        """
        msg = p.Sleep(alias=alias, timeout=timeout)
        return self._watched(msg, alias, self._long(timeout), progress)

    def wake(
        self,
        alias: str,
        *,
        timeout: float | None = None,
        progress: Callable[[p.Event | None], None] | None = None,
    ) -> p.EngineInfo:
        """Wake an asleep ``alias`` and return its EngineInfo once it is ready.

        SGLang takes its GPU memory back (ktd first puts to sleep or evicts whoever
        holds its CPUs and GPUs meanwhile) and answers one generation before the
        engine is ready again. A ready engine is answered at once. ``timeout``
        gives up waiting (``KtdError`` ``timeout``; the wake goes on); None waits
        as long as the daemon stays connected. Raises ``KtdError`` with code
        ``no_sleep``, ``unknown_model``, ``load_failed`` (the resume failed),
        ``timeout`` or ``busy``. ``progress`` is as for ``load``.
        """
        msg = p.Wake(alias=alias, timeout=timeout)
        return self._watched(msg, alias, self._long(timeout), progress)

    def logs(self, alias: str, lines: int = 100, *, probes: bool = False) -> list[str]:
        """The last ``lines`` lines of the engine's log (stdout and stderr).

        ``probes``: include the access lines of ktd's own health checks (left out by default).
        """
        msg = p.Logs(alias=alias, lines=lines, probes=probes)
        return self._expect(self._call(msg, self.timeout), p.LogsReply).lines

    def follow_logs(
        self, alias: str, lines: int = 100, *, probes: bool = False
    ) -> Generator[str, None, None]:
        """The last ``lines`` log lines, then every new one as it is written (forever).

        ``close()`` the generator (or close the client) to drop the subscription.
        Subscribes to ``log.<alias>`` *before* fetching the tail so no line falls
        in between; lines published while the tail was being fetched are
        de-duplicated against its end.
        """
        topics = [f"log.{alias}", f"probe.{alias}"] if probes else [f"log.{alias}"]
        sub = self.subscribe(topics, exact=True)
        try:
            early: list[p.Event] = []

            def keep(ev: p.Event | None) -> None:
                if ev is not None:
                    early.append(ev)

            reply = self._call(
                p.Logs(alias=alias, lines=lines, probes=probes),
                self.timeout,
                sub=sub,
                on_event=keep,
            )
            got = self._expect(reply, p.LogsReply)
            yield from got.lines
            seam = Seam(got.lines, got.upto)
            yield from seam.opening((ev.upto, ev.lines) for ev in early)
            for ev in sub:
                yield from seam.fresh(ev.upto, ev.lines)
        finally:
            sub.close()

    def wait(
        self,
        alias: str,
        states: Iterable[str] = ("ready",),
        *,
        timeout: float | None = None,
        on_event: Callable[[p.Event], None] | None = None,
    ) -> p.EngineInfo:
        """Wait until ``alias``'s engine is in one of ``states``; return its EngineInfo.

        Starts nothing: it watches (a load, a wake, an adoption after a restart is
        someone else's). Built on the events socket, not on polling: it subscribes to
        ``engine.<alias>`` first and reads the status after, so a transition between
        the two is never missed; after a gap in the events (the daemon restarted: its
        greeting came again) it reads the status again. Raises ``KtdError`` with code
        ``timeout`` after ``timeout`` seconds (None: no limit), ``load_failed`` when
        the engine becomes ``failed`` meanwhile (unless ``failed`` is waited for; an
        engine already failed is waited on: a retry may come), ``unknown_model``.
        A state this client does not know (a newer daemon's) is waited through.
        """
        wanted = frozenset(states)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self.subscribe([f"engine.{alias}"], exact=True) as sub:
            engine = self._expect(self._call(p.Status(alias=alias), self.timeout), p.StatusReply)
            state = engine.engines[0].state if engine.engines else None
            while state not in wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KtdError(
                        p.ErrorCode.TIMEOUT,
                        f"{alias} is {state}, not {' or '.join(sorted(wanted))}, "
                        f"after {timeout:g}s",
                        {"alias": alias, "state": state},
                    )
                ev = sub.get(min(left, POLL_SLICE))
                if sub.gaps():
                    reply = self._call(p.Status(alias=alias), self.timeout)
                    engine = self._expect(reply, p.StatusReply)
                    state = engine.engines[0].state if engine.engines else None
                    continue
                if ev is None or ev.state is None:
                    continue
                if on_event is not None:
                    on_event(ev)
                state = ev.state
                if state == "failed" and "failed" not in wanted:
                    why = f": {ev.reason}" if ev.reason else ""
                    raise KtdError(
                        p.ErrorCode.LOAD_FAILED,
                        f"{alias} failed while waited for{why}",
                        {"alias": alias, "state": state, "reason": ev.reason},
                    )
                if state in wanted:
                    # The full record, as ``status`` has it now (the event carries a part).
                    engine = self._expect(
                        self._call(p.Status(alias=alias), self.timeout), p.StatusReply
                    )
        return engine.engines[0]

    def schema(self) -> p.SchemaReply:
        """The daemon's protocol (its version) and its JSON Schema document: what a
        client introspects. A daemon of protocol 1.0 raises ``KtdError`` ``bad_request``."""
        return self._expect(self._call(p.Schema(), self.timeout), p.SchemaReply)

    def reload(self) -> p.Reply:
        """Re-read config.json and models.json; returns the daemon's reply (``Ok`` usually)."""
        return self._call(p.Reload(), self.timeout)

    def machine(self) -> p.MachineReply:
        """The machine as ktd places on it, read now: NUMA nodes and GPUs with their free
        memory, which engine holds which, and each alias's recent load durations."""
        budget = max(self.timeout, MACHINE_BUDGET)
        return self._expect(self._call(p.Machine(), budget), p.MachineReply)

    def engine_memory(self, alias: str) -> p.EngineMemoryReply:
        """Where ``alias``'s memory is now: its processes on each GPU (nvidia-smi) and
        NUMA node, and SGLang's own figures (``ktctl sleep --verify``)."""
        return self._expect(
            self._call(p.EngineMemory(alias=alias), self.timeout), p.EngineMemoryReply
        )

    def usage(self, since: str = "", key: str | None = None) -> list[p.UsageCount]:
        """The usage ledger's rows (day, key, model, requests, tokens, errors) from
        ``since`` (``YYYY-MM-DD``; "" all it keeps), of ``key`` (its name) or every key."""
        reply = self._call(p.Usage(since=since, key=key), self.timeout)
        return self._expect(reply, p.UsageReply).rows

    # ------------------------------------------------------------ the config (issue 39)

    def config_get(self, seq: int | None = None) -> p.ConfigReply:
        """The config's files as they are on disk (or version ``seq`` of the history) and
        their ``version``: the ``base`` to name when applying a change made from them."""
        return self._expect(self._call(p.ConfigGet(seq=seq), self.timeout), p.ConfigReply)

    def config_plan(
        self, *, config_text: str | None = None, models_text: str | None = None, base: str = ""
    ) -> p.ConfigPlanView:
        """What applying these texts would do, per engine, and what is wrong with them
        (``problems``; ``ok`` is False when one is an error). Nothing is changed. A text
        left None is that file as it is. The daemon asks each new or changed model's
        SGLang about its flags (a probe: up to 120 s the first time)."""
        msg = p.ConfigPlan(config_text=config_text, models_text=models_text, base=base)
        budget = max(self.timeout, DRY_RUN_BUDGET)
        return self._expect(self._call(msg, budget), p.ConfigPlanReply).plan

    def config_apply(
        self,
        *,
        config_text: str | None = None,
        models_text: str | None = None,
        base: str = "",
        author: str | None = None,
    ) -> p.ConfigApplyReply:
        """Write these texts and apply them as a reload does, if the files are still
        version ``base`` (else ``KtdError`` ``stale_config``) and the plan has no error
        (else ``config_error``, or ``busy`` for a load or a swap it would throw away).
        ``author`` is recorded as claimed (default: this login's name)."""
        msg = p.ConfigApply(
            config_text=config_text,
            models_text=models_text,
            base=base,
            author=_author(author),
        )
        budget = max(self.timeout, DRY_RUN_BUDGET)
        return self._expect(self._call(msg, budget), p.ConfigApplyReply)

    def config_history(self) -> p.ConfigHistoryReply:
        """The versions of the config the daemon keeps, newest first."""
        return self._expect(self._call(p.ConfigHistory(), self.timeout), p.ConfigHistoryReply)

    def config_rollback(
        self,
        seq: int | None = None,
        *,
        base: str = "",
        author: str | None = None,
        dry_run: bool = False,
    ) -> p.ConfigApplyReply | p.ConfigPlanView:
        """Apply version ``seq`` of the history again (None: the one before the files
        now), as any change is applied; ``dry_run``: its plan only."""
        msg = p.ConfigRollback(seq=seq, base=base, author=_author(author), dry_run=dry_run)
        reply = self._call(msg, max(self.timeout, DRY_RUN_BUDGET))
        if dry_run:
            return self._expect(reply, p.ConfigPlanReply).plan
        return self._expect(reply, p.ConfigApplyReply)

    def doctor(self) -> dict[str, Any]:
        """The daemon's health report: ``{"checks": [{name, status, detail, advice}, ...]}``."""
        return self._expect(self._call(p.Doctor(), self.timeout), p.DoctorReply).report

    def shutdown(self) -> str:
        """Ask ktd to stop every engine and exit; returns its acknowledgement message."""
        try:
            reply = self._call(p.Shutdown(), self._long(None))
        except ConnectionLost:
            return "ktd exited"  # it went down before its answer got out: that is success
        return reply.message if isinstance(reply, p.Ok) else ""

    def acquire(
        self,
        model: str,
        client: str,
        *,
        autoload: bool = True,
        timeout: float | None = None,
    ) -> p.AcquireReply:
        """Lease the engine serving ``model`` (loading it if ``autoload``); see ``release``.

        ``client`` names the caller; its leases expire if it stops sending
        ``heartbeat``s, so a crashed tool cannot keep an engine busy forever.
        """
        msg = p.Acquire(model=model, client=client, autoload=autoload, timeout=timeout)
        budget = self._long(timeout) if autoload else self.timeout
        return self._expect(self._call(msg, budget), p.AcquireReply)

    def release(self, lease: str) -> None:
        """Give back a lease from ``acquire``: the engine is idle again once none remain."""
        self._call(p.Release(lease=lease), self.timeout)

    def heartbeat(self, client: str) -> None:
        """Keep ``client``'s leases alive."""
        self._call(p.Heartbeat(client=client), self.timeout)

    def __repr__(self) -> str:
        return f"Client({str(self.socket_path)!r}, timeout={self.timeout!r})"
