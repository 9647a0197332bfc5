"""A request's place on a claim, the request's side of the admission desk: its ``Slot``
(where to send it, left when it ends) and its ``PendingAsk`` (the way to a slot, granted
at once or waited on).

The seam: ``ktd.frontend.broker`` owns the desk and the daemon's side (the control
client, the long poll, the claims it fetches and returns); what a request holds is
handled by the request flow, which needs only these two and the few calls they make
back (``SlotOwner``), not the broker's protocol machinery.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio

from ktd.core import admission as adm


class SlotOwner(Protocol):
    """What a slot and an ask call back on the broker that made them."""

    @property
    def desk(self) -> adm.Desk: ...

    def ended(self, held: adm.Held, key: str = "") -> None: ...

    def leave(self, rid: int) -> None: ...

    def tick(self) -> None: ...


class Slot:
    """One request's place on a claim: where to send it. ``leave()`` when it ends."""

    __slots__ = ("_broker", "alias", "held", "key", "left", "url")

    def __init__(self, broker: SlotOwner, held: adm.Held, key: str = "") -> None:
        self._broker = broker
        self.held = held
        self.key = key  # the request's key's name ("" without keys)
        self.alias = held.alias
        self.url = held.url
        self.left = False

    def leave(self) -> None:
        """Synchronous and idempotent: safe from ``finally`` in a cancelled scope."""
        if self.left:
            return
        self.left = True
        self._broker.ended(self.held, self.key)


class PendingAsk:
    """A request's way to a slot, the driver's side of the desk's ``Ask``: granted at
    once, or waited on (in slices if it likes)."""

    __slots__ = (
        "_broker",
        "_done",
        "answered",
        "claimed",
        "error",
        "load_timeout",
        "model",
        "rid",
        "slot",
    )

    def __init__(self, broker: SlotOwner, rid: int, model: str, load_timeout: float) -> None:
        self._broker = broker
        self.rid = rid
        self.model = model
        self.load_timeout = load_timeout
        self.slot: Slot | None = None
        self.error: Exception | None = None
        self.claimed = False  # the request took its slot (it leaves it itself)
        self._done: trio.Event | None = None  # made only if the request has to wait
        self.answered = False

    def answer(self, slot: Slot | None, error: Exception | None) -> None:
        self.slot, self.error = slot, error
        self.answered = True
        if self._done is not None:
            self._done.set()

    async def wait(self, limit: float = math.inf) -> Slot | None:
        """The slot, or None if ``limit`` seconds passed first. Raises the refusal."""
        if not self.answered:
            if self._done is None:
                self._done = trio.Event()
            with trio.move_on_after(limit):
                while not self.answered:
                    with trio.move_on_at(self._broker.desk.next_deadline()):
                        await self._done.wait()
                    self._broker.tick()  # a deadline: the desk times it out
        if self.error is not None:
            raise self.error
        if self.slot is not None:
            self.claimed = True
        return self.slot

    def abandon(self) -> None:
        """Give up unless claimed: a slot given to us meanwhile goes to the next request."""
        if self.claimed:
            return
        self.claimed = True
        if self.slot is not None:
            self.slot.leave()
        else:
            self._broker.leave(self.rid)
