"""The daemon's table of the frontends' standing claims, and the long-polled recalls.

Why claims and not a lease per request: a lease cost every request a round trip
to the daemon (0.3-0.6 ms, the largest part of the frontend's added latency),
and the lease table lived only in the daemon's memory. A frontend now holds one
claim per engine it has traffic for, counts its requests itself and reports
them; the daemon decides from the reports and asks for a claim back before it
takes the engine away. The decisions are pure (``ktd.core.claimsync``); this module
keeps the table, wakes parked ``Sync`` replies and persists the claims with the
engines (``engines.json``) so a restarted daemon knows them.

Races, and why each ends well:

* *Evict (or a swap, a reload, shutdown) vs a new request.* The daemon recalls
  (``drain``) before it drains; the frontend stops routing to the engine the
  moment the recall arrives and gives the claim back once its requests there
  have ended. A request that arrived at the frontend before the recall runs to
  its end; one after it asks the daemon for a new claim and waits its turn
  (behind the swap, or for the reload). The drain waits for the claims as it
  waited for leases (bounded by ``drain_timeout``; ``--force`` cuts).
* *TTL vs a request starting.* The daemon never TTL-evicts an engine a claim is
  held on: it recalls ``idle`` with the TTL, and the frontend gives the claim
  back only if it has had no request for that long. A request that started
  meanwhile makes the frontend keep the claim and report; the report answers
  the recall and restarts the idle clock. The eviction itself happens only once
  no claim is left; a request after the give-back claims anew, before the evict
  (the claim is granted, the engine stays) or after it (the request waits for a
  reload), never on a dying engine.
* *A claim granted while a report travels.* The report does not list it yet.
  Each grant is numbered and reports carry the highest number they reflect, so
  an unlisted claim counts as given back only if the report saw its grant.
* *Frontend death.* Its reports stop; after ``lease_ttl`` its claims go (and its
  acquire leases). A restarted frontend has a new client id; its predecessor's
  claims expire the same way. A claim restored after a restart of ktd whose
  frontend's process is gone is void at once: no report can come (each claim
  keeps its frontend's pid, from ``SO_PEERCRED``, and start time).
* *Daemon ``kill -9`` with streams running.* Streams go straight to the engines
  and continue. The claims are in the state file with the engines; the new
  daemon restores them unconfirmed, counts each as busy, and lets them live
  ``lease_ttl`` from its start. The frontend's next report (its long poll times
  out and reconnects) confirms them with real counts. Until then no TTL fires
  (busy), and an evict or reload waits for the frontend to answer the recall.
* *Daemon SIGSTOP past ``lease_ttl``.* On continue, heartbeats wait unread in
  the socket while the sweeper may run first. The sweeper sees that it woke far
  too late and expires nobody that round, and judges no TTL until the reports
  queued during the pause are read (``ktd.core.expiry``).
* *Recall lost* (a parked reply to a frontend that just died, a restart):
  recalls stay outstanding and ride on every reply to that frontend until the
  claim is given back or the report answers them.
* *A burst of requests for a cold model.* The frontend sends one ``Claim`` per
  model, whatever the number of requests; nothing per request crosses the
  socket, so no reply can be lost to a high-water mark.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

import trio

from ktd import protocol as p
from ktd.core import claimsync as policy
from ktd.core import states as S
from ktd.core.claimsync import ClaimRec, FrontendProcess, Restored
from ktd.daemon.engine import proctree

if TYPE_CHECKING:
    from ktd.daemon.engine.engine import Engine

log = logging.getLogger("ktd")


#: The start time of process ``pid`` (``/proc/PID/stat``), None when there is none alive.
StartOf = Callable[[int], "int | None"]


def claim_side(engine: Engine) -> policy.EngineSide:
    return policy.EngineSide(state=engine.state, url=engine.url, adopting=engine.adopting())


class ClaimTable:
    def __init__(
        self, *, on_change: Callable[[Engine, bool], None], start_of: StartOf = proctree.start_of
    ) -> None:
        self.run = secrets.token_hex(6)  # this daemon run: reports name the one they saw
        self._grants = itertools.count(1)
        # on_change(engine, persist): events and TTL re-check; the state file only when
        # the set of claims changed (``persist``), not for a report's new counts.
        self._on_change = on_change
        self.by_id: dict[str, tuple[Engine, ClaimRec]] = {}
        self.queued: dict[str, dict[str, int]] = {}  # client -> alias -> waiting requests
        self.since: dict[str, dict[str, float]] = {}  # client -> alias -> oldest came (wall)
        self._tell: dict[str, set[str]] = {}  # client -> claims to tell it to drop
        self._parked: dict[str, trio.Event] = {}  # client -> its parked Sync's wake-up
        self.holders: dict[str, FrontendProcess] = {}  # client -> its process (claims keep it)
        self._start_of = start_of

    # ------------------------------------------------------------ queries

    def of_client(self, client: str) -> dict[str, ClaimRec]:
        return {cid: rec for cid, (_, rec) in self.by_id.items() if rec.client == client}

    def recalls_for(self, client: str) -> list[p.Recall]:
        """Every outstanding recall: a reply lost on the way is made good by the next."""
        out = []
        for _, rec in self.by_id.values():
            if rec.client == client and rec.recall is not None:
                rec.told = True
                out.append(rec.recall)
        return out

    def queued_for(self, alias: str) -> int:
        return policy.queued_for(alias, self.queued.values())

    def queued_since(self, alias: str) -> float | None:
        """When the oldest request a frontend says waits for ``alias`` came (wall clock)."""
        return policy.queued_since(alias, self.since.values())

    def reply_for(self, claim_id: str) -> p.ClaimReply:
        engine, rec = self.by_id[claim_id]
        return p.ClaimReply(
            claim=rec.id,
            alias=engine.alias,
            url=engine.url or "",
            daemon=self.run,
            grant=rec.grant,
            max_concurrent=engine.spec.max_concurrent,
            max_queue=engine.spec.max_queue,
            api_key=engine.api_key,
        )

    def sync_reply(self, client: str, limits: dict[str, p.Limits]) -> p.SyncReply:
        dropped = sorted(self._tell.pop(client, ()))
        return p.SyncReply(
            daemon=self.run, recalls=self.recalls_for(client), dropped=dropped, limits=limits
        )

    # ------------------------------------------------------------ changes

    def heard_from(self, client: str, pid: int | None) -> None:
        """The process a frontend's message came from (the kernel's pid; None or 0: not
        known, another pid namespace). Looked up once per client id (one read of
        ``/proc/PID/stat``); its claims keep it."""
        if not pid or client in self.holders:
            return
        start = self._start_of(pid)
        if start is not None:
            self.holders[client] = FrontendProcess(pid, start)

    def grant(self, engine: Engine, client: str) -> str:
        """The client's claim on ``engine``: its routing one if it has it, else a new one."""
        for rec in engine.claims.values():
            if (
                rec.client == client
                and rec.routing
                and (rec.recall is None or rec.recall.kind == "idle")
            ):
                rec.recall = None  # wanted again: not idle any more
                return rec.id
        rec = ClaimRec(
            id=secrets.token_hex(8),
            client=client,
            alias=engine.alias,
            grant=next(self._grants),
            holder=self.holders.get(client),
        )
        self._add(engine, rec)
        return rec.id

    def _add(self, engine: Engine, rec: ClaimRec) -> None:
        engine.claims[rec.id] = rec
        self.by_id[rec.id] = (engine, rec)
        self._on_change(engine, True)

    def give_back(self, client: str, claim_id: str) -> bool:
        found = self.by_id.get(claim_id)
        if found is None or found[1].client != client:
            return False
        self._remove(found[0], found[1])
        return True

    def _remove(self, engine: Engine, rec: ClaimRec) -> None:
        self.by_id.pop(rec.id, None)
        if engine.claims.pop(rec.id, None) is not None:
            self._on_change(engine, True)

    def report(self, msg: p.Sync, engines: Mapping[str, Engine]) -> None:
        """A frontend's report: confirm, take over, forget, and answer idle recalls."""
        sides = {alias: claim_side(e) for alias, e in engines.items()}
        result = policy.reconcile(msg, self.of_client(msg.client), sides, self.run)
        self.queued[msg.client] = {a: n for a, n in msg.queued.items() if n}
        wall = time.time()
        self.since[msg.client] = {a: wall - s for a, s in msg.oldest.items()}
        changed: set[str] = set()
        for rec, st in result.confirm:
            engine = self.by_id[rec.id][0]
            rec.confirmed = True
            before = (rec.in_flight, rec.routing)
            rec.in_flight, rec.idle, rec.routing = st.in_flight, st.idle, st.routing
            engine.used(ago=st.idle, busy=st.in_flight > 0)
            if rec.recall is not None and policy.answered(rec.recall, st):
                rec.recall = None
            if before != (rec.in_flight, rec.routing):
                changed.add(engine.alias)
        for st in result.take_over:
            engine = engines[st.alias]
            rec = ClaimRec(
                id=st.claim,
                client=msg.client,
                alias=st.alias,
                in_flight=st.in_flight,
                idle=st.idle,
                routing=st.routing,
                holder=self.holders.get(msg.client),
            )
            if engine.state != S.READY:  # draining: it must come back
                rec.recall = p.Recall(claim=rec.id, alias=engine.alias, reason="draining")
            self._add(engine, rec)
        for rec in result.gone:
            self._remove(self.by_id[rec.id][0], rec)
        if result.dropped:
            self._tell.setdefault(msg.client, set()).update(result.dropped)
        for alias in changed:
            if alias in engines:
                self._on_change(engines[alias], False)

    def recall(
        self,
        engine: Engine,
        *,
        kind: Literal["drain", "idle"] = "drain",
        idle: float = 0.0,
        reason: str = "",
    ) -> int:
        """Ask every holder of a claim on ``engine`` to give it back; wakes their long polls."""
        asked = 0
        for rec in engine.claims.values():
            new = p.Recall(claim=rec.id, alias=engine.alias, kind=kind, idle=idle, reason=reason)
            if policy.stronger(new, rec.recall):
                rec.recall = new
                rec.told = False
                if kind == "drain":
                    rec.routing = False
                self.wake(rec.client)
                asked += 1
        return asked

    def revoke(self, engine: Engine) -> None:
        """The engine stopped serving (crash, forced evict, stopped): its claims are void."""
        for rec in list(engine.claims.values()):
            self._tell.setdefault(rec.client, set()).add(rec.id)
            self.wake(rec.client)
            self._remove(engine, rec)

    def expire(self, clients: Iterable[str]) -> None:
        dead = set(clients)
        for engine, rec in list(self.by_id.values()):
            if rec.client in dead:
                self._remove(engine, rec)
        for client in dead:
            self.queued.pop(client, None)
            self.since.pop(client, None)
            self._tell.pop(client, None)
            self.holders.pop(client, None)

    def restore(self, engine: Engine, records: Iterable[Restored]) -> list[str]:
        """Claims the previous daemon run persisted: busy until their holder reports;
        void at once when its frontend's process is gone (``void_at_restore``).
        Returns the clients of the claims kept."""
        clients: list[str] = []
        void: set[int] = set()  # the pids of the frontends that are gone
        for claim_id, client, holder in records:
            now = self._start_of(holder.pid) if holder is not None else None
            if holder is not None and policy.void_at_restore(holder, now):
                void.add(holder.pid)
                continue
            rec = ClaimRec(
                id=claim_id, client=client, alias=engine.alias, confirmed=False, holder=holder
            )
            engine.claims[rec.id] = rec
            self.by_id[rec.id] = (engine, rec)
            if holder is not None:
                self.holders.setdefault(client, holder)
            clients.append(client)
        if void:
            pids = ", ".join(str(pid) for pid in sorted(void))
            log.info("%s: claims voided: their frontend is gone (pid %s)", engine.alias, pids)
        return clients

    # ------------------------------------------------------------ long poll

    def wake(self, client: str) -> None:
        event = self._parked.get(client)
        if event is not None:
            event.set()

    def wake_others(self, client: str) -> None:
        """Every parked long poll but ``client``'s answers now (a key's holds changed)."""
        for other, event in self._parked.items():
            if other != client:
                event.set()

    async def park(self, client: str, wait: float) -> None:
        """Hold a ``Sync`` reply until a recall for ``client`` or ``wait`` seconds.

        One parked reply per client: a newer long poll answers the older at once.
        """
        old = self._parked.get(client)
        if old is not None:
            old.set()
        event = trio.Event()
        self._parked[client] = event
        try:
            with trio.move_on_after(wait):
                await event.wait()
        finally:
            if self._parked.get(client) is event:
                del self._parked[client]

    def has_news(self, client: str) -> bool:
        """Something this client has not been told yet: a parked reply goes out at once."""
        return bool(self._tell.get(client)) or any(
            rec.client == client and rec.recall is not None and not rec.told
            for _, rec in self.by_id.values()
        )
