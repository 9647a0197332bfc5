"""A key's tokens for the day (pure): reserved when a request is admitted, settled when
it ends.

Why reserve: a key's ``tokens_per_day`` used to be checked against the tokens already
reported, which arrive only when a request ends; twenty requests admitted at once all
saw the same morning and together spent three times the day (issue 43). So a request
reserves what it may cost (``ktd.frontend.reserve``: the completion limit it asks for, or
the route's default, and an estimate of its prompt) before it reaches the desk, and
gives the reservation back for what it really cost when it ends.

The rule, per key, with ``spent`` the day's tokens (what ended here, or the ledger's
total for the day across frontends when that is more) and ``held`` what the requests
under way at this frontend reserved:

* ``spent >= limit``: refused until the UTC day turns (``Exhausted``);
* ``spent + held + amount <= limit``: granted;
* nothing held (``held == 0``): granted, the one request that may go past the limit: a
  key whose day is nearly spent may still finish it, and a request that asks more than
  a whole day is served alone rather than never;
* else refused until a request under way ends and gives back what it did not use
  (``Crowded``).

So whatever arrives at once, what this frontend grants and what was spent never pass
the limit by more than one request's reservation (``tests/core/test_budget.py``'s
machine checks it); what a request costs beyond its reservation (a prompt longer than
estimated) is counted when it ends and refuses the next.

Several frontends share a key's day (the daemon's ledger adds every frontend's). Each
frontend's claim report says what its requests hold per key (``Sync.reserved``: its
reservations, and the tokens it counted that the ledger has not yet been sent), the
daemon keeps them (``Holds``) and tells every other frontend the sum (``SyncReply.held``),
waking their long polls when it changes; each frontend reserves against the ledger's day
plus its own reservations plus the others'. A report goes out within 50 ms of a change,
so the others learn of a reservation within that and a round trip; what two frontends
grant in that window is the only overshoot beyond one request's reservation.
``docs/architecture.md`` ("The usage ledger") has it.

Pure: days are days since the epoch (UTC), handed in by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Budget", "Crowded", "Exhausted", "Holds", "Reservation"]


@dataclass(frozen=True)
class Reservation:
    """What one admitted request holds of its key's day until it ends."""

    id: int
    key: str
    amount: int


class Exhausted(Exception):
    """The key spent its ``tokens_per_day``; it may come back on day ``resets``."""

    def __init__(self, key: str, limit: int, resets: int) -> None:
        super().__init__(f"key {key!r} has used its {limit} tokens for today (tokens_per_day)")
        self.key = key
        self.limit = limit
        self.resets = resets  # days since the epoch: at 00:00 UTC of that day


class Crowded(Exception):
    """The key's requests under way hold what is left of its day; one that ends gives back
    what it did not use."""

    def __init__(self, key: str, limit: int, spent: int, held: int, amount: int) -> None:
        super().__init__(
            f"key {key!r} has spent {spent} of its {limit} tokens for today and its "
            f"requests under way hold {held} more; this one reserves {amount} "
            f"(its max_tokens or the route's default, and its prompt)"
        )
        self.key = key
        self.limit = limit
        self.spent = spent
        self.held = held
        self.amount = amount


@dataclass
class KeyDay:
    """One key's day at this frontend."""

    day: int = -1  # the UTC day ``spent`` counts
    spent: int = 0
    held: dict[int, int] = field(default_factory=dict)  # reservation id -> amount

    def reserved(self) -> int:
        return sum(self.held.values())


class Budget:
    """Every key's day of tokens at one frontend."""

    def __init__(self) -> None:
        self.keys: dict[str, KeyDay] = {}
        self.others: dict[str, int] = {}  # what the other frontends' requests hold, per key
        self.limited: set[str] = set()  # keys seen with a tokens_per_day
        self._ids = 0

    def _day(self, key: str, today: int) -> KeyDay:
        found = self.keys.get(key)
        if found is None:
            found = self.keys[key] = KeyDay()
        if today > found.day:
            found.day, found.spent = today, 0  # a new day; what is under way still holds
        return found

    def spent_today(self, key: str, today: int) -> int:
        found = self.keys.get(key)
        return found.spent if found is not None and found.day == today else 0

    def held(self, key: str) -> int:
        """What this frontend's requests under way hold of ``key``'s day."""
        found = self.keys.get(key)
        return found.reserved() if found is not None else 0

    def holding(self, unsent: Mapping[str, int]) -> dict[str, int]:
        """What this frontend holds of each limited key's day, for its report: its
        reservations and ``unsent``, the tokens it counted that the report does not carry."""
        out = {key: self.held(key) + unsent.get(key, 0) for key in self.limited}
        return {key: n for key, n in out.items() if n > 0}

    def reserve(self, key: str, limit: int | None, amount: int, today: int) -> Reservation:
        """``amount`` tokens of ``key``'s day (``limit`` None: no limit, nothing held);
        raises ``Exhausted`` or ``Crowded`` (the module's rule)."""
        amount = max(0, amount)
        self._ids += 1
        if limit is None:
            return Reservation(self._ids, key, 0)
        self.limited.add(key)
        use = self._day(key, today)
        held = use.reserved() + self.others.get(key, 0)
        if use.spent >= limit:
            raise Exhausted(key, limit, today + 1)
        if use.spent + held + amount > limit and held > 0:
            raise Crowded(key, limit, use.spent, held, amount)
        use.held[self._ids] = amount
        return Reservation(self._ids, key, amount)

    def release(self, reservation: Reservation) -> None:
        """The request ended (its tokens go to ``spent``, counted apart): its reservation
        is given back. Idempotent."""
        use = self.keys.get(reservation.key)
        if use is not None:
            use.held.pop(reservation.id, None)
            self._forget(reservation.key, use)

    def spent(self, key: str, day: int, tokens: int, *, total: bool = False) -> None:
        """Tokens ``key`` used on ``day``: a request's (added), or the ledger's ``total``
        for the day across frontends (taken when it is more than counted here)."""
        use = self._day(key, day)
        if day < use.day:
            return  # yesterday's news
        use.spent = max(use.spent, tokens) if total else use.spent + tokens

    def _forget(self, key: str, use: KeyDay) -> None:
        if not use.held and not use.spent:
            del self.keys[key]  # nothing to remember


class Holds:
    """What every frontend's requests hold of each key's day, as its last report said (the
    daemon's side; in memory: after a restart, each frontend's next report says it again)."""

    def __init__(self) -> None:
        self.by_client: dict[str, dict[str, int]] = {}

    def report(self, client: str, held: Mapping[str, int]) -> bool:
        """``client``'s report; True when what it holds changed (the others should hear)."""
        now = {key: n for key, n in held.items() if n > 0}
        before = self.by_client.get(client, {})
        if now:
            self.by_client[client] = now
        else:
            self.by_client.pop(client, None)
        return now != before

    def others(self, client: str) -> dict[str, int]:
        """What every frontend but ``client`` holds, per key."""
        out: dict[str, int] = {}
        for other, held in self.by_client.items():
            if other != client:
                for key, n in held.items():
                    out[key] = out.get(key, 0) + n
        return out

    def forget(self, clients: Iterable[str]) -> bool:
        """Frontends gone (expired): nothing of theirs is held any more."""
        gone = [c for c in clients if self.by_client.pop(c, None) is not None]
        return bool(gone)
