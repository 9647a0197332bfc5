"""The usage ledger on disk: ``usage.json`` in the state directory.

Why the daemon keeps it: frontends come and go (and several may run), the daemon's state
directory outlives them all. A frontend's batch is added and the file written, whole or not
at all (``statefile.write_bytes``), before the reply that acknowledges it leaves, so a
``kill -9`` of either process neither loses an acknowledged count nor adds one twice
(``ktd.core.usage`` has the rule). A file that does not decode is set aside, never read as
an empty ledger and overwritten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ktd import protocol as p
from ktd.core import usage as u
from ktd.daemon import statefile

__all__ = ["UsageStore"]

log = logging.getLogger(__name__)

#: Days of rows kept: a year and a day, so last year's same day still compares.
KEEP_DAYS = 366


class _File(msgspec.Struct, kw_only=True):
    version: int = 1
    rows: list[p.UsageCount] = []
    clients: dict[str, u.Seen] = {}


_decoder = msgspec.json.Decoder(_File)


class UsageStore:
    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.ledger = self._read()
        if self.ledger.forget(self.today(), KEEP_DAYS):
            self._write()

    def today(self) -> str:
        return u.day_of(self.clock())

    def _read(self) -> u.Ledger:
        if self.path is None:
            return u.Ledger()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return u.Ledger()
        except OSError as exc:
            log.error("cannot read the usage ledger %s: %s", self.path, exc)
            return u.Ledger()
        try:
            file = _decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            problem = f"usage ledger {self.path} is corrupt ({exc})"
            try:
                log.error("%s; set aside as %s", problem, statefile.set_aside(self.path).name)
            except OSError as err:
                log.error("%s; cannot set it aside: %s", problem, err)
            return u.Ledger()
        ledger = u.Ledger(clients=file.clients)
        ledger.merge(u.from_wire(wire) for wire in file.rows)
        return ledger

    def _write(self) -> None:
        if self.path is None:
            return
        ledger = self.ledger
        file = _File(
            rows=[u.to_wire(row, count) for row, count in ledger.query()],
            clients=ledger.clients,
        )
        try:
            statefile.write_bytes(self.path, msgspec.json.encode(file))
        except OSError as exc:
            # Kept in memory and written with the next batch; a crash before that loses it.
            log.error("cannot write the usage ledger %s: %s", self.path, exc)

    def report(self, client: str, seq: int, counts: list[p.UsageCount]) -> None:
        """A frontend's batch (from its ``Sync``): added once and written before the reply."""
        if not counts and seq == 0:
            return
        today = self.today()
        if self.ledger.add(client, seq, (u.from_wire(c) for c in counts), today):
            self.ledger.forget(today, KEEP_DAYS)
            self._write()

    def acked(self, client: str) -> int:
        return self.ledger.acked(client)

    def spent(self) -> tuple[str, dict[str, int]]:
        """Today, and the tokens each key spent today."""
        today = self.today()
        return today, self.ledger.spent(today)

    def rows(self, since: str = "", key: str | None = None) -> list[p.UsageCount]:
        return [u.to_wire(row, count) for row, count in self.ledger.query(since, key)]
