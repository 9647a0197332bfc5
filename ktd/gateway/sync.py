"""The one trio task that owns the gateway sync, and the pool's hooks into it.

Why one task: registrations are a small, shared piece of truth (which URLs each
router lists). Engine supervisors only *ask* (``before_drain``, a state change
poke) and wait for that task to report; they never call a router themselves, so
a router that is down or slow can only delay a drain by ``deregister_timeout``
and never blocks a load or an evict.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import trio

from ktd.core import states as S
from ktd.core.config import FrontendSection, GatewaySection
from ktd.core.states import Phase, Step
from ktd.core.verdict import Check
from ktd.gateway import plan
from ktd.gateway.client import RouterClient, RouterError
from ktd.gateway.host import EngineLike, PoolLike
from ktd.protocol import EngineInfo, GatewayInfo, Registration, RouterInfo

log = logging.getLogger("ktd.gateway")

#: While registrations are in flight the router is re-read this often (the add is a
#: background job there): the time from ready to routable stays short.
PENDING_POLL = 0.2
#: An add the router has not listed after this long is sent again (its job failed).
ADD_RETRY_AFTER = 15.0


@dataclass
class RouterState:
    url: str
    client: RouterClient
    seen: list[plan.Listed] | None = None
    up: bool | None = None
    error: str | None = None
    failures: int = 0
    next_try: float = -math.inf  # trio clock
    last_sync: float | None = None  # wall clock
    generation: int = 0  # completed syncs (``before_drain`` waits for a fresh one)
    added: int = 0
    removed: int = 0
    errors: int = 0
    adds_sent: dict[str, float] = field(default_factory=dict)  # url -> trio time
    retired: bool = False  # dropped from the config: one last clean-up, then forgotten

    def pending(self, desired: plan.Desired, instance: str) -> bool:
        if self.seen is None:
            return False
        return bool(plan.reconcile(desired, self.seen, instance))

    def info(self, instance: str) -> RouterInfo:
        seen = self.seen or []
        nxt = None
        if self.up is False and self.next_try > trio.current_time():
            nxt = time.time() + (self.next_try - trio.current_time())
        return RouterInfo(
            url=self.url,
            up=self.up,
            error=self.error,
            last_sync=self.last_sync,
            next_try=nxt,
            failures=self.failures,
            workers=len(seen),
            ours=sum(1 for s in seen if s.owner() == instance),
            added=self.added,
            removed=self.removed,
            errors=self.errors,
        )


def instance_id(pool_instance: str) -> str:
    """Stable across ktd restarts (state dir) and unique across hosts (host name)."""
    return f"{socket.gethostname()}/{pool_instance}"


class GatewaySync:
    def __init__(
        self,
        config: GatewaySection,
        frontend: FrontendSection,
        pool: PoolLike,
        *,
        instance: str,
        host_name: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.pool = pool
        self._transport = transport  # tests: a router in-process
        self.instance = instance
        self.host_name = host_name or socket.gethostname()
        self.config = config
        self.frontend = frontend
        self.leaving: set[str] = set()
        self.shutting_down = False
        self.frontend_up = False
        self.routers: dict[str, RouterState] = {}
        self._http: httpx.AsyncClient | None = None
        self._poke = trio.Event()
        self._synced = trio.Event()

    # ------------------------------------------------------------ configuration

    @property
    def enabled(self) -> bool:
        return bool(self.config.routers)

    def apply_config(self, config: GatewaySection, frontend: FrontendSection) -> None:
        """Reload: routers added start syncing, removed ones get our workers taken off."""
        self.config = config
        self.frontend = frontend
        if self._http is not None:
            self._build_routers()
        self.poke()

    def _build_routers(self) -> None:
        assert self._http is not None
        wanted = [plan.normalize_url(u) for u in self.config.routers]
        for url, r in self.routers.items():
            r.retired = url not in wanted
            r.client.headers = RouterClient(url, self._http, api_key=self.config.api_key).headers
            r.client.timeout = self.config.timeout
        for url in wanted:
            if url not in self.routers:
                client = RouterClient(
                    url, self._http, api_key=self.config.api_key, timeout=self.config.timeout
                )
                self.routers[url] = RouterState(url=url, client=client)

    # ------------------------------------------------------------ what we want

    def _labels(self) -> dict[str, str]:
        return plan.base_labels(self.instance, self.host_name, self.config.labels)

    def views(self) -> list[plan.Local]:
        out = []
        for e in self.pool.engines.values():
            run = e.run or e.adopt
            adopting = e.adopt is not None or (
                e.state == S.STARTING and e.run is not None and e.run.adopted_state == S.READY
            )
            plan_ = e.plan
            out.append(
                plan.Local(
                    alias=e.alias,
                    state=e.state,
                    host=e.spec.host,
                    port=run.port if run else None,
                    numa_nodes=tuple(plan_.numa_nodes) if plan_ else (),
                    gpus=tuple(plan_.gpus) if plan_ else (),
                    leaving=e.alias in self.leaving,
                    adopting=adopting,
                )
            )
        return out

    def frontend_url(self) -> str:
        return plan.frontend_url(self.frontend.bind, self.config.advertise)

    def frontend_model_id(self) -> str:
        if self.config.model_id:
            return self.config.model_id
        served = sorted(self.pool.engines)
        return served[0] if len(served) == 1 else "ktd"

    def desired(self) -> plan.Desired:
        if not self.enabled:
            return plan.Desired()
        if self.config.mode == "frontend":
            return plan.desired_frontend(
                self.frontend_url(),
                self.frontend_model_id(),
                self._labels(),
                up=self.frontend_up,
                shutting_down=self.shutting_down,
            )
        return plan.desired_engines(
            self.views(),
            advertise=self.config.advertise,
            labels=self._labels(),
            shutting_down=self.shutting_down,
        )

    def _worker_api_key(self, worker: plan.Worker) -> str | None:
        """What the router sends the worker. An engine accepts its own key alone (ktd's,
        or the user's ``--api-key``: ``Engine.api_key``), whatever ``worker_api_key``
        says; the frontend takes ``worker_api_key``, else its first key."""
        if worker.alias is None:
            if self.config.worker_api_key:
                return self.config.worker_api_key
            return self.frontend.api_keys[0] if self.frontend.api_keys else None
        engine = self.pool.engines.get(worker.alias)
        if engine is not None and engine.api_key:
            return engine.api_key
        return self.config.worker_api_key

    # ------------------------------------------------------------ pool hooks

    def poke(self) -> None:
        self._poke.set()

    def engine_changed(self, engine: EngineLike) -> None:
        if engine.state in (S.STOPPED, S.FAILED, S.STARTING, S.ASLEEP):
            # Gone (or asleep): a later ready (or wake) registers it afresh.
            self.leaving.discard(engine.alias)
        if self.enabled:
            self.poke()

    @property
    def routes_engines(self) -> bool:
        """Routers send requests straight to the engines: a stop waits for their
        ``/v1/loads`` to count none (``ktd.core.lifecycle``'s drain)."""
        return self.enabled and self.config.mode == "engines"

    async def before_drain(self, engine: EngineLike) -> bool:
        """Deregister ``engine`` everywhere; True once every router has confirmed it.

        Runs in the engine's owner task before it drains: once every reachable
        router has confirmed (a ``GET /workers`` after the removal) that the URL
        is gone, no new request can arrive. Requests already in flight (they hold
        no ktd lease, they came straight from the router) are the drain's: the
        engine's lifecycle waits for its ``/v1/loads`` to count none, within the
        same drain budget (``engine_drain``). A router that is down is not waited for,
        but it has not confirmed either: a sleep is then no sleep (it comes back up
        listing the engine and sends it requests and health checks), the engine is
        stopped instead (``ktd.core.lifecycle``).
        """
        if not self.enabled or self.config.mode != "engines":
            return True
        self.leaving.add(engine.alias)
        marks = {url: r.generation for url, r in self.routers.items()}
        self.poke()
        engine.set_phase(Phase.of(Step.DEREGISTERING))
        view = next((v for v in self.views() if v.alias == engine.alias), None)
        url = None
        if view is not None and view.port is not None:
            url = plan.engine_worker(
                view, advertise=self.config.advertise, labels=self._labels()
            ).url
        with trio.move_on_after(self.config.deregister_timeout) as scope:
            while url is not None and not self._gone_everywhere(url, marks):
                await self._synced.wait()
        if scope.cancelled_caught:
            log.warning(
                "%s: routers did not confirm deregistration within %gs; draining anyway",
                engine.alias,
                self.config.deregister_timeout,
            )
        return url is None or (
            self._gone_everywhere(url, marks) and all(r.up is not False for r in self._live())
        )

    def _gone_everywhere(self, url: str, marks: dict[str, int]) -> bool:
        """Every reachable router re-read since ``marks`` and does not list ``url``.

        An add still running at a router (sent, not listed yet) counts as listed:
        its job would put the worker back after we looked.
        """
        u = plan.normalize_url(url)
        for key, r in self.routers.items():
            if r.up is False or r.retired:
                continue  # down: it cannot route anything to the engine either
            if r.generation <= marks.get(key, -1) or r.seen is None:
                return False
            if u in r.adds_sent or any(plan.normalize_url(s.url) == u for s in r.seen):
                return False
        return True

    async def shutdown(self) -> None:
        """Daemon stop, frontend mode: the frontend leaves the routers before ktd goes."""
        self.shutting_down = True
        if not self.enabled or self.config.mode != "frontend":
            return
        marks = {url: r.generation for url, r in self.routers.items()}
        self.poke()
        with trio.move_on_after(self.config.deregister_timeout):
            while not self._gone_everywhere(self.frontend_url(), marks):
                await self._synced.wait()

    def annotate(self, info: EngineInfo) -> None:
        """``ktctl status``: the engine's registration on each router (engines mode)."""
        if not self.enabled or self.config.mode != "engines":
            return
        view = next((v for v in self.views() if v.alias == info.alias), None)
        if view is None or view.port is None:
            info.gateway = [Registration(router=r.url, state="absent") for r in self._live()]
            return
        url = plan.engine_worker(view, advertise=self.config.advertise, labels=self._labels()).url
        desired = self.desired()
        regs = []
        for r in self._live():
            wid = next((s.id for s in r.seen or [] if plan.normalize_url(s.url) == url), None)
            state = plan.registration_state(url, desired, r.seen if r.up is not False else None)
            regs.append(Registration(router=r.url, state=state, url=url, worker_id=wid))
        info.gateway = regs

    def info(self) -> GatewayInfo | None:
        if not self.enabled:
            return None
        return GatewayInfo(
            mode=self.config.mode,
            routers=[r.info(self.instance) for r in self._live()],
            frontend_url=self.frontend_url() if self.config.mode == "frontend" else None,
        )

    async def doctor_checks(self) -> list[Check]:
        """Fresh probes of every router, judged against what this ktd wants there now."""
        from ktd.gateway import doctor

        if not self.enabled or self._http is None:
            return []
        probes = await doctor.probe_async(self.config, self._http)
        desired = self.desired()
        hosts = [urlsplit(w.url).hostname or "" for w in desired.workers]
        if self.config.mode == "frontend":
            hosts.append(urlsplit(self.frontend_url()).hostname or "")
        return doctor.checks(
            self.config,
            probes,
            instance=self.instance,
            wanted=[w.url for w in desired.workers],
            advertised_hosts=hosts,
        )

    def _live(self) -> list[RouterState]:
        return [r for r in self.routers.values() if not r.retired]

    # ------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(trust_env=False, transport=self._transport) as http:
            self._http = http
            self._build_routers()
            task_status.started()
            while True:
                self._poke = trio.Event()
                if self.routers:
                    await self._pass()
                await self._sleep(self._next_wait())

    async def _sleep(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._poke.wait()

    def _next_wait(self) -> float:
        if not self.routers:
            return math.inf
        desired = self.desired()
        now = trio.current_time()
        wait = self.config.reconcile_interval
        for r in self.routers.values():
            if r.up is False:
                wait = min(wait, max(0.0, r.next_try - now))
            elif r.pending(desired, self.instance):
                wait = min(wait, PENDING_POLL)
        return wait

    async def _pass(self) -> None:
        if self.config.mode == "frontend" and self.enabled:
            self.frontend_up = await self._probe_frontend()
        desired = self.desired()
        # Retired at the start of this pass: synced with nothing wanted (our workers taken
        # off), then forgotten; one retired by a reload meanwhile waits for the next pass.
        jobs = [(r, r.retired) for r in self.routers.values()]
        async with trio.open_nursery() as n:
            for r, retired in jobs:
                n.start_soon(self._sync_router, r, plan.Desired() if retired else desired)
        for r, retired in jobs:
            if retired and r.retired and (r.up is True or r.failures > 3):
                self.routers.pop(r.url, None)
        self._synced.set()
        self._synced = trio.Event()

    async def _probe_frontend(self) -> bool:
        assert self._http is not None
        host, _, port = self.frontend.bind.rpartition(":")
        host = host.strip("[]")
        if host in plan.WILDCARD_HOSTS:
            host = "127.0.0.1"
        try:
            r = await self._http.get(
                f"http://{plan.url_host(host)}:{port}/health", timeout=self.config.timeout
            )
        except (httpx.HTTPError, OSError):
            return False
        return r.status_code == 200

    async def _sync_router(self, r: RouterState, desired: plan.Desired) -> None:
        now = trio.current_time()
        if r.up is False and now < r.next_try:
            return
        try:
            seen = await r.client.list_workers()
            came_back = r.up is False
            acted = False
            for action in plan.reconcile(desired, seen, self.instance):
                if action.kind == "remove" and action.worker_id is not None:
                    await r.client.remove(action.worker_id)
                    r.removed += 1
                    acted = True
                    r.adds_sent.pop(action.url, None)
                    log.info("gateway %s: removed %s (%s)", r.url, action.url, action.reason)
                elif action.kind == "add" and action.worker is not None:
                    sent = r.adds_sent.get(action.url)
                    if sent is not None and now - sent < ADD_RETRY_AFTER and not came_back:
                        continue  # the router's add job is still running
                    await r.client.add(
                        action.worker,
                        worker_api_key=self._worker_api_key(action.worker),
                        health_check_interval=self.config.health_check_interval,
                    )
                    r.adds_sent[action.url] = now
                    r.added += 1
                    acted = True
                    log.info("gateway %s: registered %s", r.url, action.url)
                elif action.kind == "update" and action.worker and action.worker_id:
                    await r.client.update_labels(action.worker_id, action.worker.label_dict())
                    acted = True
                    log.info("gateway %s: updated the labels of %s", r.url, action.url)
            if acted:
                seen = await r.client.list_workers()
            listed = {plan.normalize_url(s.url) for s in seen}
            for url, sent in list(r.adds_sent.items()):
                if url in listed or now - sent >= ADD_RETRY_AFTER:
                    del r.adds_sent[url]  # listed, or its job failed at the router
            if came_back:
                log.info("gateway %s: reachable again", r.url)
            r.seen, r.up, r.error, r.failures = seen, True, None, 0
            r.last_sync = time.time()
        except RouterError as exc:
            r.failures += 1
            r.errors += 1
            delay = plan.backoff(r.failures, 0.5, self.config.backoff_max)
            if r.up is not False:
                log.warning("gateway %s: %s (retrying with backoff)", r.url, exc)
            r.up, r.error, r.seen = False, str(exc), None
            r.next_try = trio.current_time() + delay
            r.adds_sent.clear()
        finally:
            r.generation += 1
