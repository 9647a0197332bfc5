"""The usage ledger on disk: ``usage.json`` and its journal in the state directory.

Why the daemon keeps it: frontends come and go (and several may run), the daemon's state
directory outlives them all. A frontend's batch is made durable before the reply that
acknowledges it leaves, so a ``kill -9`` of either process neither loses an acknowledged
count nor adds one twice (``ktd.core.usage`` has the rule).

Why a journal: the ledger holds a year of rows (per day, key and model: hundreds of KB
with many keys and models), and a report comes with every claim report that carries
counts. Rewriting the whole file, with an fsync, inside the control socket's pump for
each one costs in proportion to the year. So a batch is one line appended to
``usage.json.journal`` (and fsynced); every ``COMPACT_EVERY`` lines, and at start when
the journal holds any, the ledger is written whole to ``usage.json`` (whole or not at
all, ``statefile.write_bytes``) and a new journal begins.

How a crash between the two steps adds nothing twice: each journal starts with a line
naming it (a random id), and ``usage.json`` records the id of the journal it absorbed.
A restarted daemon replays the journal onto ``usage.json`` only when that journal was
not absorbed; a line cut short by a crash was never acknowledged (its fsync did not
return), so it is dropped and its frontend sends the batch again. A ``usage.json`` that
does not decode is set aside, never read as an empty ledger and overwritten; a journal
whose middle does not decode is set aside too.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ktd import foreign
from ktd import protocol as p
from ktd.core import budget
from ktd.core import usage as u
from ktd.daemon.pool import statefile

__all__ = ["COMPACT_EVERY", "UsageStore"]

log = logging.getLogger(__name__)

#: Days of rows kept: a year and a day, so last year's same day still compares.
KEEP_DAYS = 366
#: Journal lines between two whole writes of the ledger.
COMPACT_EVERY = 1000


class _File(msgspec.Struct, kw_only=True):
    version: int = 1
    rows: list[p.UsageCount] = []
    clients: dict[str, u.Seen] = {}
    absorbed: str = ""  # the id of the journal whose lines these rows hold


class _Head(msgspec.Struct, kw_only=True):
    journal: str


class _Entry(msgspec.Struct, kw_only=True):
    """One acknowledged batch, as its frontend sent it."""

    client: str
    seq: int
    day: str  # the day it was added (the frontend was heard then)
    counts: list[p.UsageCount]


_decoder = msgspec.json.Decoder(_File)
_head_decoder = msgspec.json.Decoder(_Head)
_entry_decoder = msgspec.json.Decoder(_Entry)
_encode = msgspec.json.Encoder().encode


class UsageStore:
    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal") if path is not None else None
        self.clock = clock
        # What each frontend's requests hold of the keys' days (in memory: ``Sync.reserved``).
        self.holds = budget.Holds()
        self.ledger, absorbed = self._read()
        self._journal_id = absorbed  # the journal on disk: what the next whole write absorbs
        self._lines = 0  # lines in it
        # Whether a line may be appended to it: not after a line that may be cut short
        # (a crash, a failed write), which would make every later line unreadable.
        self._live = self._replay(absorbed)
        if self.ledger.forget(self.today(), KEEP_DAYS) or not self._live or self._lines:
            self._compact()

    def today(self) -> str:
        return u.day_of(self.clock())

    def _read(self) -> tuple[u.Ledger, str]:
        """The ledger as ``usage.json`` holds it, and the journal it absorbed."""
        if self.path is None:
            return u.Ledger(), ""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return u.Ledger(), ""
        except OSError as exc:
            log.error("cannot read the usage ledger %s: %s", self.path, exc)
            return u.Ledger(), ""
        try:
            file = foreign.json(data, _decoder)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            _set_aside(self.path, f"usage ledger {self.path} is corrupt ({exc})")
            return u.Ledger(), ""
        ledger = u.Ledger(clients=file.clients)
        ledger.merge(u.from_wire(wire) for wire in file.rows)
        return ledger, file.absorbed

    def _replay(self, absorbed: str) -> bool:
        """Add the journal's batches unless ``usage.json`` absorbed it (counted in
        ``_lines``); True when new lines may be appended to it as it is."""
        if self.journal is None:
            return True
        try:
            data = self.journal.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("cannot read the usage journal %s: %s", self.journal, exc)
            return False
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a line a crash cut short
        try:
            head = foreign.json(lines[0], _head_decoder) if lines else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            head = None
        if head is None:
            _set_aside(self.journal, f"usage journal {self.journal} has no head")
            return False
        self._journal_id = head.journal
        if head.journal == absorbed:
            return False  # written whole into usage.json, then a crash ended the compaction
        for n, line in enumerate(lines[1:], start=2):
            try:
                entry = foreign.json(line, _entry_decoder)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                _set_aside(self.journal, f"usage journal {self.journal} line {n}: {exc}")
                return False
            self._lines += 1
            self.ledger.add(
                entry.client, entry.seq, (u.from_wire(c) for c in entry.counts), entry.day
            )
        if torn:
            log.warning(
                "usage journal %s: a line cut short, never acknowledged, dropped", self.journal
            )
            return False
        return True

    def _compact(self) -> None:
        """Write the ledger whole, then begin a new journal: every ``COMPACT_EVERY``
        lines, at start, and after a journal line could not be written."""
        if self.path is None or self.journal is None:
            return
        self._live = False  # until the new journal is there
        ledger = self.ledger
        file = _File(
            rows=[u.to_wire(row, count) for row, count in ledger.query()],
            clients=ledger.clients,
            absorbed=self._journal_id,
        )
        fresh = secrets.token_hex(8)
        try:
            statefile.write_bytes(self.path, _encode(file))
            statefile.write_bytes(self.journal, _encode(_Head(journal=fresh)) + b"\n")
        except OSError as exc:
            # Kept in memory and written with the next batch; a crash before that loses it.
            log.error("cannot write the usage ledger %s: %s", self.path, exc)
            return
        self._journal_id, self._lines, self._live = fresh, 0, True

    def _append(self, entry: _Entry) -> None:
        """One batch, durable before the reply: a journal line, fsynced."""
        if self.journal is None:
            return
        if not self._live:
            self._compact()  # the whole ledger, this batch in it
            return
        try:
            fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                statefile.write_all(fd, _encode(entry) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("cannot append to the usage journal %s: %s", self.journal, exc)
            self._compact()  # the whole ledger instead, this batch in it (else: the next)
            return
        self._lines += 1
        if self._lines >= COMPACT_EVERY:
            self._compact()

    def report(
        self,
        client: str,
        seq: int,
        counts: list[p.UsageCount],
        reserved: dict[str, int] | None = None,
    ) -> bool:
        """A frontend's batch (from its ``Sync``): added once and written before the reply;
        and what its requests hold (``reserved``). True when what it holds changed: the
        other frontends should hear at once."""
        changed = self.holds.report(client, reserved or {})
        if not counts and seq == 0:
            return changed
        today = self.today()
        if self.ledger.add(client, seq, (u.from_wire(c) for c in counts), today):
            self.ledger.forget(today, KEEP_DAYS)
            self._append(_Entry(client=client, seq=seq, day=today, counts=counts))
        return changed

    def answer(self, client: str, reply: p.SyncReply) -> None:
        """What a ``Sync`` reply says of the ledger: the last batch of ``client``'s it holds,
        today, each key's tokens today, and what the other frontends' requests hold."""
        reply.usage_seq = self.ledger.acked(client)
        reply.day, reply.spent = self.spent()
        reply.held = self.holds.others(client)

    def acked(self, client: str) -> int:
        return self.ledger.acked(client)

    def spent(self) -> tuple[str, dict[str, int]]:
        """Today, and the tokens each key spent today."""
        today = self.today()
        return today, self.ledger.spent(today)

    def rows(self, since: str = "", key: str | None = None) -> list[p.UsageCount]:
        return [u.to_wire(row, count) for row, count in self.ledger.query(since, key)]


def _set_aside(path: Path, problem: str) -> None:
    """Keep a file that does not decode for the operator, out of the way of the next write."""
    try:
        log.error("%s; set aside as %s", problem, statefile.set_aside(path).name)
    except OSError as err:
        log.error("%s; cannot set it aside: %s", problem, err)
