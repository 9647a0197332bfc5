"""The daemon's admission: acquire leases and claim requests, carried out for the gates.

Each engine has a pure ``ktd.core.admission.Gate``; this module feeds it (a request
arrives, the engine changed, a lease ended, a swap began or ended, a deadline came)
and carries out what it answers: a grant (a lease, or a frontend's claim), a refusal
rendered as the control API's error, or a load. A waiting request is one trio task
parked on its own event; it never polls, and it never decides anything itself.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ktd.control.errors import ControlError
from ktd.core.admission import Answer, GateWaiter, WaitEnd, WantUp
from ktd.daemon.engine.engine import Engine, Lease
from ktd.protocol import ErrorCode

if TYPE_CHECKING:
    from ktd.daemon.pool.claimtable import ClaimTable


@dataclass
class _PendingWaiter:
    """The driver's side of a ``GateWaiter``: what its task waits on."""

    waiter: GateWaiter
    client: str
    done: trio.Event = field(default_factory=trio.Event)
    outcome: WaitEnd | None = None
    granted: str = ""  # the lease or claim id


class Gatekeeper:
    def __init__(
        self,
        claims: ClaimTable,
        *,
        heard: Callable[[str], None],
        on_lease: Callable[[Engine], None],
        settle: Callable[[Engine], Any],
        known: Callable[[], list[str]],
    ) -> None:
        self.claims = claims
        self.leases: dict[str, Engine] = {}  # lease id -> its engine
        self._tickets = itertools.count()  # arrival order, across engines (swaps compare them)
        self._pending: dict[int, _PendingWaiter] = {}
        self._heard = heard  # a client was heard (its leases stay alive)
        self._on_lease = on_lease  # a lease came or went: events, TTL
        self._settle = settle  # raises the error an ended load attempt deserves
        self._known = known  # the models served, for "removed" errors
        self._updating: set[str] = set()
        self._again: set[str] = set()

    def ticket(self) -> int:
        return next(self._tickets)

    # ------------------------------------------------------------ requests

    def grant_now(self, engine: Engine, client: str, *, claim: bool) -> str | None:
        """The fast path (answered in the socket pump's pass): granted at once or None."""
        if not engine.gate.may_pass(claim=claim, view=engine.view(), limits=engine.limits):
            return None
        return self._grant(engine, client, claim)

    async def acquire(
        self,
        engine: Engine,
        client: str,
        *,
        claim: bool = False,
        autoload: bool = True,
        timeout: float | None = None,
    ) -> str:
        """A lease (or claim) on ``engine``: at once, or after a load, a swap or a slot.

        Waits in arrival order; ``queue_full`` past ``max_queue`` (HTTP 429); a failed
        engine is retried by the first request after its backoff, before that
        ``load_failed`` with ``retry_after``; ``timeout`` (0 or None: none) ends in
        ``timeout`` while the load goes on.
        """
        self._heard(client)
        limit = math.inf if timeout is None or timeout <= 0 else timeout
        waiter = GateWaiter(
            ticket=self.ticket(),
            claim=claim,
            autoload=autoload,
            deadline=trio.current_time() + limit,
        )
        pending = _PendingWaiter(waiter, client)
        self._pending[waiter.ticket] = pending
        try:
            actions = engine.gate.arrive(waiter, engine.view(), engine.limits, trio.current_time())
            self._carry_out(engine, actions)
            if pending.outcome is None:
                engine.notify_changed()  # its queue grew: status and reports
            while pending.outcome is None:
                with trio.move_on_at(waiter.deadline):
                    await pending.done.wait()
                if pending.outcome is None:
                    self.update(engine)  # a deadline: the gate times it out
        finally:
            self._pending.pop(waiter.ticket, None)
            if pending.outcome is None:  # cancelled (its client went away)
                engine.gate.leave(waiter.ticket)
                self.update(engine)
        return self._answer(engine, pending, limit)

    def _answer(self, engine: Engine, pending: _PendingWaiter, limit: float) -> str:
        outcome = pending.outcome
        alias = engine.alias
        if outcome == WaitEnd.GRANTED:
            return pending.granted
        if outcome == WaitEnd.QUEUE_FULL:
            waiting = engine.gate.leases_waiting()
            raise ControlError(
                ErrorCode.QUEUE_FULL,
                engine.limits.full_message(waiting),
                {"queued": waiting, "retry_after": 1.0},
            )
        if outcome == WaitEnd.TIMEOUT:
            raise ControlError(
                ErrorCode.TIMEOUT,
                f"{alias} not ready after {limit:g}s (still {engine.state}; the load goes on)",
                {"state": engine.state},
            )
        if outcome == WaitEnd.NOT_LOADED:
            raise ControlError(
                ErrorCode.NOT_LOADED,
                f"{alias} is not loaded (state {engine.state}); run: ktctl load {alias}",
                {"state": engine.state},
            )
        if outcome == WaitEnd.RETRY_LATER:
            wait = engine.retry_in()
            raise ControlError(
                ErrorCode.LOAD_FAILED,
                f"{alias} failed: {engine.reason}; the next request after {wait:.0f}s "
                f"retries it (or run `ktctl load {alias}`)",
                {"reason": engine.reason, "log_tail": engine.log.last(20), "retry_after": wait},
            )
        if outcome == WaitEnd.REMOVED:
            raise ControlError(
                ErrorCode.UNKNOWN_MODEL,
                f"{alias} was removed from the config while the request waited",
                {"models": self._known()},
            )
        if outcome == WaitEnd.CLOSED:
            raise ControlError(ErrorCode.SHUTTING_DOWN, "ktd is shutting down")
        # ATTEMPT_ENDED: the load it waited for ended without ready; ``settle`` raises why
        # (load_failed, or busy). Should another load have made it ready since, say so.
        self._settle(engine)
        raise ControlError(ErrorCode.LOAD_FAILED, f"{alias}: the load it waited for ended")

    # ------------------------------------------------------------ the gates' actions

    def update(self, engine: Engine) -> None:
        """Feed ``engine``'s gate its current view; re-entrant calls fold into one more pass."""
        alias = engine.alias
        if alias in self._updating:
            self._again.add(alias)
            return
        self._updating.add(alias)
        try:
            while True:
                self._again.discard(alias)
                actions = engine.gate.update(engine.view(), engine.limits, trio.current_time())
                self._carry_out(engine, actions)
                if alias not in self._again:
                    break
        finally:
            self._updating.discard(alias)

    def _carry_out(self, engine: Engine, actions: list[Answer | WantUp]) -> None:
        for action in actions:
            if isinstance(action, WantUp):
                engine.request_up()
                continue
            pending = self._pending.get(action.ticket)
            if pending is None:
                continue
            if action.outcome == WaitEnd.GRANTED:
                pending.granted = self._grant(engine, pending.client, pending.waiter.claim)
            pending.outcome = action.outcome
            pending.done.set()

    # ------------------------------------------------------------ leases

    def _grant(self, engine: Engine, client: str, claim: bool) -> str:
        # Heard now: during a long load the sweeper may have dropped the client, and a
        # lease of a client it no longer tracks would never expire.
        self._heard(client)
        if claim:
            return self.claims.grant(engine, client)
        lease = Lease(id=secrets.token_hex(8), client=client)
        engine.add_lease(lease)
        self.leases[lease.id] = engine
        self._on_lease(engine)
        return lease.id

    def release(self, lease_id: str) -> bool:
        engine = self.leases.pop(lease_id, None)
        if engine is None:
            return False
        engine.drop_lease(lease_id)
        self._on_lease(engine)
        return True

    def release_clients(self, clients: frozenset[str]) -> None:
        """The leases of clients that went silent (they died)."""
        for lease_id, engine in list(self.leases.items()):
            lease = engine.leases.get(lease_id)
            if lease is not None and lease.client in clients:
                self.release(lease_id)
