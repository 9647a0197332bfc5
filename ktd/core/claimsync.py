"""The claim protocol's decisions on the daemon's side (pure: no trio, no sockets).

A frontend holds one standing *claim* per engine it has traffic for, counts its
own requests on it and reports them (``Sync``); the daemon grants claims, asks
for them back (``Recall``) and believes the reports. ``ktd.daemon.pool.claimtable`` has
the race analysis and carries these decisions out; this module decides:

* what a report means for the claims the daemon holds (``reconcile``): which it
  confirms, which it takes over from a previous daemon run, which it no longer
  holds, and which it tells the frontend to drop;
* when an ``idle`` recall is answered by a report (the frontend was busier than
  the recall asked) and must not be repeated;
* whether a claim restored from the state file is void at once: its frontend's
  process is gone (``void_at_restore``);

Whether a client went silent is ``ktd.core.expiry``'s question.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ktd import protocol as p
from ktd.core import states as S


@dataclass(frozen=True)
class FrontendProcess:
    """The frontend process behind a client id: its pid, as the kernel gave it when it
    sent its claims (``SO_PEERCRED``), and that process's start time (clock ticks since
    boot, ``/proc/PID/stat``), which tells it from a later process given the same pid."""

    pid: int
    start: int


#: A claim as the state file gives it back: (claim id, client, its frontend's process).
Restored = tuple[str, str, FrontendProcess | None]


def void_at_restore(holder: FrontendProcess | None, start_now: int | None) -> bool:
    """A claim a previous daemon run persisted is void at once when its frontend is gone:
    no process has its pid now (``start_now`` None; a zombie is none) or another one does
    (another start time). Its holder cannot report or give it back, and it held the
    engine busy until ``lease_ttl`` (a SIGTERM after a ``kill -9`` and a restart waited
    that long to stop idle engines). An unknown holder (a state file from before, a
    frontend in another pid namespace) keeps its claim: ``lease_ttl`` to report, as ever."""
    return holder is not None and start_now != holder.start


@dataclass
class ClaimRec:
    """One claim as the daemon holds it."""

    id: str
    client: str
    alias: str
    grant: int = 0  # grant number in this daemon run; 0 = taken over from an earlier run
    confirmed: bool = True  # False: restored from the state file, no report seen yet
    in_flight: int = 0
    idle: float = 0.0  # the frontend's last report: seconds since its last request ended
    routing: bool = True
    recall: p.Recall | None = None  # outstanding until the claim goes or a report answers it
    told: bool = False  # the recall went out in a reply at least once (then it is not news)
    holder: FrontendProcess | None = None  # its frontend's process, when the socket showed it

    @property
    def counts_as(self) -> int:
        """Requests in flight it stands for: the reported ones; at least one while
        unconfirmed (unknown)."""
        return self.in_flight if self.confirmed else max(1, self.in_flight)


@dataclass(frozen=True)
class EngineSide:
    """What reconciliation needs to know of an engine."""

    state: str
    url: str | None
    adopting: bool = False


def may_hold(engine: EngineSide) -> bool:
    """Claims live from ready to the end of the drain, a sleep's included (and through an
    adoption): a recalled claim is given back when its requests end, never dropped."""
    return engine.state in (S.READY, S.DRAINING, S.SLEEPING) or (
        engine.state == S.STARTING and engine.adopting
    )


@dataclass
class Reconciled:
    confirm: list[tuple[ClaimRec, p.ClaimState]] = field(default_factory=list)
    take_over: list[p.ClaimState] = field(default_factory=list)  # from an earlier daemon run
    gone: list[ClaimRec] = field(default_factory=list)  # given back (the Return got lost)
    dropped: list[str] = field(default_factory=list)  # the frontend must stop using these


def reconcile(
    report: p.Sync,
    held: Mapping[str, ClaimRec],
    engines: Mapping[str, EngineSide],
    run: str,
) -> Reconciled:
    """Match one frontend's report against the claims the daemon holds for it.

    ``held``: this client's claims by id. A claim the daemon granted after the
    frontend built its report is missing from it without having been given back:
    it is "gone" only if the report's ``seen`` covers its grant (same daemon run),
    or if it was taken over from an earlier run (the frontend had it long before).
    A reported claim the daemon does not hold is taken over only when the report
    predates this daemon run (the daemon restarted) and the engine is the one the
    frontend talks to (same URL, still serving); otherwise the frontend drops it.
    """
    out = Reconciled()
    same_run = report.daemon == run
    reported: set[str] = set()
    for st in report.claims:
        reported.add(st.claim)
        rec = held.get(st.claim)
        if rec is not None:
            out.confirm.append((rec, st))
            continue
        engine = engines.get(st.alias)
        if (
            not same_run
            and engine is not None
            and may_hold(engine)
            and engine.url is not None
            and engine.url.rstrip("/") == st.url.rstrip("/")
        ):
            out.take_over.append(st)
        else:
            out.dropped.append(st.claim)
    for rec in held.values():
        if rec.id in reported:
            continue
        if rec.grant == 0 or (same_run and rec.grant <= report.seen):
            out.gone.append(rec)
    return out


def answered(recall: p.Recall, st: p.ClaimState) -> bool:
    """An ``idle`` recall with a threshold is answered by a report busier than that.

    The frontend keeps the claim when it had a request within ``recall.idle``
    seconds; its report says so, and the daemon's idle clock starts again from
    it instead of repeating the recall. ``idle`` 0 (restart when idle) waits for
    the frontend to give the claim back at its first idle moment.
    """
    if recall.kind != "idle" or recall.idle <= 0:
        return False
    return st.in_flight > 0 or st.idle < recall.idle


def stronger(new: p.Recall, old: p.Recall | None) -> bool:
    """A drain overrides an idle recall; an idle one never weakens a drain."""
    if old is None:
        return True
    if old.kind == "drain":
        return False
    return new.kind == "drain" or new.idle < old.idle


def queued_for(alias: str, reports: Iterable[Mapping[str, int]]) -> int:
    """Requests the frontends say wait for ``alias`` (admission, load, swap)."""
    return sum(r.get(alias, 0) for r in reports)


def queued_since(alias: str, reports: Iterable[Mapping[str, float]]) -> float | None:
    """When the oldest request the frontends say wait for ``alias`` came (their
    ``Sync.oldest``, made wall-clock times on arrival), or None."""
    return min((r[alias] for r in reports if alias in r), default=None)
