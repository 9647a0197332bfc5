"""Who answers each control request: the routing table of the control socket.

The server (``ktd.daemon.server``) owns the socket: the pump, the frames, the replies that
cannot be delivered, the frames that are no request. Which part of the daemon answers a
request, and on whose behalf, is this module's: the engines' control operations
(``ktd.daemon.pool.controls``), the pool's leases and claims, the config desk, the catalog's
pulls and the daemon's own (reload, doctor, shutdown). Where to add a control request:
its ``case`` here, in the area it belongs to. The seam is the request and its sender
(``Peer``, from ``SO_PEERCRED``): nothing here knows the socket.

Requests that need no waiting are answered in the pump's pass (``now``); the others in a
task of their own (``later``).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ktd import __version__, protocol_schema
from ktd import protocol as p
from ktd.catalog.pulls import Puller
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import Peer
from ktd.core import trust
from ktd.daemon.config.desk import ConfigDesk, Who
from ktd.daemon.pool.controls import Controls
from ktd.daemon.pool.pool import Pool

#: The uid of a sender the socket did not show: no one's (never ktd's owner, nor root).
NOBODY = -1


def _asker(uid: int | None) -> int:
    """A request whose sender the socket did not show (no Peer-Address: not ipc, not
    Linux) is nobody's: it may read the config, not change it (fail closed)."""
    return uid if uid is not None else NOBODY


def _pid(peer: Peer | None) -> int | None:
    """The pid of the request's sender, as the kernel gave it (``SO_PEERCRED``)."""
    return peer.pid if peer is not None else None


def _by_owner(peer: Peer | None) -> bool:
    """Whether the request was sent by ktd's owner (``SO_PEERCRED``)."""
    return peer is not None and trust.is_owner(peer.uid, os.getuid())


def no_gateway() -> p.GatewayInfo | None:
    return None


@dataclass
class Dispatch:
    """Each request to who answers it; ``None`` for an optional part this daemon lacks
    (its requests are then unsupported)."""

    ops: Controls
    reload: Callable[[Who], Awaitable[str]]
    doctor: Callable[[], Awaitable[dict[str, Any]]]
    dry_run: Callable[[str], Awaitable[dict[str, Any]]]
    shutdown: Callable[[], None]
    gateway: Callable[[], p.GatewayInfo | None] = no_gateway
    machine: Callable[[], Awaitable[p.MachineReply]] | None = None
    config: ConfigDesk | None = None
    catalog: Callable[[str | None], Awaitable[p.CatalogReply]] | None = None
    pulls: Puller | None = None

    @property
    def pool(self) -> Pool:
        """The engines' pool, whose leases and claims the frontends' requests take."""
        return self.ops.pool

    def now(self, req: p.Request, peer: Peer | None) -> p.Reply | None:
        """Requests that need no waiting are answered inside the pump, in the same pass
        that read them: no task, no extra scheduler round (the frontend's acquire and
        release sit on every request's path). None = needs a task."""
        for answer in (self._engines_now, self._leases_now, self._daemon_now):
            reply = answer(req, peer)
            if reply is not None:
                return reply
        return None

    def _engines_now(self, req: p.Request, peer: Peer | None) -> p.Reply | None:
        """What the engines are (status, models, logs), and a keep-alive: all at once."""
        ops = self.ops
        match req:
            case p.Status(alias=alias):
                engines = ops.status(alias)
                if not _by_owner(peer):  # docs/security.md: secrets are the owner's
                    for info in engines:
                        info.argv = trust.hidden_argv(info.argv)
                return p.StatusReply(engines=engines, gateway=self.gateway())
            case p.Models():
                return p.ModelsReply(models=ops.models())
            case p.Logs(alias=alias, lines=lines, probes=probes):
                tail, upto = ops.logs(alias, lines, probes=probes)
                return p.LogsReply(alias=alias, lines=tail, upto=upto)
            case p.KeepAlive(model=model, seconds=seconds, forever=forever):
                return p.Ok(message=ops.keep_alive(model, seconds, forever=forever))
        return None

    def _leases_now(self, req: p.Request, peer: Peer | None) -> p.Reply | None:
        """The frontends' leases, claims and reports, when the pool can answer them in this
        pass (an acquire or a claim that must wait, a parked sync: None)."""
        match req:
            case p.Acquire(model=model, client=client):
                now = self.pool.grant_now(model, client, claim=False)
                if now is None:
                    return None
                lease, engine = now
                return p.AcquireReply(
                    lease=lease, alias=engine.alias, url=engine.url or "", api_key=engine.api_key
                )
            case p.Release(lease=lease):
                found = self.pool.release(lease)
                return p.Ok(message="released" if found else "unknown lease (already expired)")
            case p.Heartbeat(client=client):
                self.pool.heartbeat(client)
                return p.Ok()
            case p.Claim(model=model, client=client):
                now = self.pool.grant_now(model, client, claim=True, pid=_pid(peer))
                return None if now is None else self.pool.claim_reply(now[0])
            case p.Sync():
                # Recorded here, in the pass that read it: a heartbeat is never judged late
                # because its task had not run yet. None: parked (the long poll).
                return self.pool.sync(req, _pid(peer))
            case p.Return(client=client, claim=claim):
                found = self.pool.give_back(client, claim)
                return p.Ok(message="returned" if found else "unknown claim (already gone)")
            case p.EngineKeys():
                return p.EngineKeysReply(keys=self.pool.engine_keys())
            case p.Usage(since=since, key=key):
                return p.UsageReply(rows=self.pool.usage.rows(since, key))
        return None

    def _daemon_now(self, req: p.Request, peer: Peer | None) -> p.Reply | None:
        """The daemon's own: who it is, its schema, its shutdown, its pulls' table."""
        match req:
            case p.Ping():
                return p.Pong(
                    version=__version__,
                    pid=os.getpid(),
                    protocol=p.PROTOCOL,
                    features=list(p.FEATURES),
                )
            case p.Schema():
                return p.SchemaReply(protocol=p.PROTOCOL, schema=protocol_schema.current())
            case p.Shutdown():
                self.shutdown()
                return p.Ok(message="shutting down")
            case p.Pulls() if self.pulls is not None:
                return p.PullsReply(jobs=self.pulls.jobs())
            case p.PullCancel(name=name, repo=repo) if self.pulls is not None:
                return self.pulls.cancel(name, repo)
        return None

    async def later(self, req: p.Request, peer: Peer | None) -> p.Reply:
        """Requests that wait (a load may take minutes), each in a task of its own."""
        uid = peer.uid if peer is not None else None
        for later in (
            self._engines_later,
            self._config_later,
            self._leases_later,
            self._daemon_later,
        ):
            reply = await later(req, uid)
            if reply is not None:
                return reply
        raise ControlError(p.ErrorCode.BAD_REQUEST, f"unsupported request {type(req).__name__}")

    async def _engines_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """The engines' control operations: load (or its dry run), evict, sleep, wake."""
        ops = self.ops
        match req:
            case p.Load(alias=alias, dry_run=True):
                spec = self.pool.engine(alias).spec
                plan = await self.dry_run(alias)
                if not trust.is_owner(_asker(uid), os.getuid()):
                    plan = trust.hidden_launch(plan, spec)
                return p.PlanReply(plan=plan)
            case p.Load(alias=alias, wait=wait, timeout=timeout):
                return p.LoadReply(engine=await ops.load(alias, wait=wait, timeout=timeout))
            case p.Evict(alias=alias, all=all_, force=force, timeout=timeout):
                evicted = await ops.evict(alias, all=all_, force=force, timeout=timeout)
                return p.EvictReply(evicted=evicted)
            case p.Sleep(alias=alias, timeout=timeout):
                # Long (a drain, then SGLang's release): in a task, like load and evict.
                return p.LoadReply(engine=await ops.sleep(alias, timeout=timeout))
            case p.Wake(alias=alias, timeout=timeout):
                return p.LoadReply(engine=await ops.wake(alias, timeout=timeout))
            case p.EngineMemory(alias=alias):
                return await ops.engine_memory(alias)
        return None

    async def _config_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """A reload, and the config desk's requests. Who may read, plan and change:
        ``ConfigDesk.role`` (docs/security.md)."""
        desk, asker = self.config, _asker(uid)
        match req:
            case p.Reload():
                return p.Ok(message=await self.reload(Who(uid=uid)))
            case p.ConfigGet(seq=seq, delegated=delegated) if desk is not None:
                return await desk.get(seq, Who(uid=asker, delegated=delegated))
            case p.ConfigPlan(config_text=cfg, models_text=models, base=base) if desk is not None:
                who = Who(uid=asker, delegated=req.delegated)
                return p.ConfigPlanReply(plan=await desk.plan(cfg, models, base, who))
            case p.ConfigApply(config_text=cfg, models_text=models, base=base) if desk is not None:
                who = Who(uid=asker, claimed=req.author, delegated=req.delegated)
                return await desk.apply(cfg, models, base, who)
            case p.ConfigHistory() if desk is not None:
                return await desk.history_now()
            case p.ConfigRollback(seq=seq, base=base, dry_run=dry_run) if desk is not None:
                who = Who(uid=asker, claimed=req.author, delegated=req.delegated)
                return await desk.rollback(seq, base, who, dry_run=dry_run)
        return None

    async def _leases_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """An acquire or a claim that waits for its engine, a sync's long poll."""
        pool = self.pool
        match req:
            case p.Acquire(model=model, client=client, autoload=autoload, timeout=timeout):
                lease, engine = await pool.acquire(
                    model, client, autoload=autoload, timeout=timeout
                )
                return p.AcquireReply(
                    lease=lease, alias=engine.alias, url=engine.url or "", api_key=engine.api_key
                )
            case p.Claim(model=model, client=client, autoload=autoload, timeout=timeout):
                claim, _ = await pool.acquire(
                    model, client, autoload=autoload, timeout=timeout, claim=True
                )
                return pool.claim_reply(claim)
            case p.Sync(client=client, wait=wait):
                await pool.park(client, wait)
                return pool.sync_reply(client)
        return None

    async def _daemon_later(self, req: p.Request, uid: int | None) -> p.Reply | None:
        """Doctor, the machine, the catalog and a pull: each reads files or runs tools."""
        match req:
            case p.Doctor():
                return p.DoctorReply(report=await self.doctor())
            case p.Machine() if self.machine is not None:
                return await self.machine()
            case p.Catalog(name=name) if self.catalog is not None:
                return await self.catalog(name)
            case p.Pull(name=name, repo=repo, dry_run=True) if self.pulls is not None:
                return await self.pulls.dry_run(name, repo)
            case p.Pull(name=name, repo=repo, force=force) if self.pulls is not None:
                # async: a catalog name is resolved off the event loop (files, nvidia-smi)
                return await self.pulls.request(name, repo, force=force)
        return None
