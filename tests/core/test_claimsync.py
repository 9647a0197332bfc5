"""The claim protocol's pure decisions: reconciliation, idle recalls, and what a report answers."""

from __future__ import annotations

from ktd import protocol as p
from ktd.core import claimsync as c
from ktd.core import states as S

URL = "http://127.0.0.1:30001"
RUN = "run-b"
READY = {"m": c.EngineSide(state=S.READY, url=URL)}


def state(claim: str, **kw: object) -> p.ClaimState:
    return p.ClaimState(claim=claim, alias="m", url=URL, **kw)  # type: ignore[arg-type]


def report(*claims: p.ClaimState, daemon: str = RUN, seen: int = 0) -> p.Sync:
    return p.Sync(client="fe", claims=list(claims), daemon=daemon, seen=seen)


def rec(claim: str, grant: int = 1, **kw: object) -> c.ClaimRec:
    return c.ClaimRec(id=claim, client="fe", alias="m", grant=grant, **kw)  # type: ignore[arg-type]


def test_a_reported_claim_is_confirmed() -> None:
    held = {"a": rec("a")}
    out = c.reconcile(report(state("a", in_flight=2)), held, READY, RUN)
    assert [(r.id, st.in_flight) for r, st in out.confirm] == [("a", 2)]
    assert not out.gone and not out.dropped and not out.take_over


def test_a_claim_granted_while_the_report_travelled_is_not_taken_for_given_back() -> None:
    held = {"a": rec("a", grant=5)}
    # The report was built before grant 5 reached the frontend.
    assert c.reconcile(report(seen=4), held, READY, RUN).gone == []
    # Once the frontend has seen grant 5, a report without it means it went back.
    assert [r.id for r in c.reconcile(report(seen=5), held, READY, RUN).gone] == ["a"]


def test_grant_numbers_of_another_daemon_run_prove_nothing() -> None:
    held = {"a": rec("a", grant=2)}
    assert c.reconcile(report(daemon="run-a", seen=99), held, READY, RUN).gone == []


def test_a_restored_claim_not_reported_is_gone() -> None:
    held = {"a": rec("a", grant=0, confirmed=False)}
    assert [r.id for r in c.reconcile(report(daemon="run-a"), held, READY, RUN).gone] == ["a"]


def test_a_restarted_daemon_takes_over_claims_on_the_same_engine() -> None:
    out = c.reconcile(report(state("x", in_flight=1), daemon="run-a"), {}, READY, RUN)
    assert [st.claim for st in out.take_over] == ["x"] and not out.dropped


def test_claims_on_another_engine_or_a_stopped_one_are_dropped() -> None:
    moved = {"m": c.EngineSide(state=S.READY, url="http://127.0.0.1:30002")}
    stopped = {"m": c.EngineSide(state=S.STOPPED, url=None)}
    for engines in (moved, stopped, {}):
        out = c.reconcile(report(state("x"), daemon="run-a"), {}, engines, RUN)
        assert out.dropped == ["x"] and not out.take_over


def test_an_unknown_claim_in_a_report_of_this_run_is_dropped() -> None:
    # This daemon granted it and took it back (revoked): never resurrected.
    out = c.reconcile(report(state("x")), {}, READY, RUN)
    assert out.dropped == ["x"] and not out.take_over


def test_claims_survive_an_adoption() -> None:
    adopting = {"m": c.EngineSide(state=S.STARTING, url=URL, adopting=True)}
    assert c.may_hold(adopting["m"])
    assert not c.may_hold(c.EngineSide(state=S.STARTING, url=URL))
    assert not c.may_hold(c.EngineSide(state=S.STOPPING, url=URL))
    out = c.reconcile(report(state("x"), daemon="run-a"), {}, adopting, RUN)
    assert [st.claim for st in out.take_over] == ["x"]


def test_an_idle_recall_is_answered_by_a_busier_report() -> None:
    ttl = p.Recall(claim="a", alias="m", kind="idle", idle=60)
    assert c.answered(ttl, state("a", in_flight=1))
    assert c.answered(ttl, state("a", idle=5))
    assert not c.answered(ttl, state("a", idle=61))
    restart = p.Recall(claim="a", alias="m", kind="idle", idle=0)
    assert not c.answered(restart, state("a", in_flight=3))  # given back at its first idle
    drain = p.Recall(claim="a", alias="m")
    assert not c.answered(drain, state("a", in_flight=1))


def test_a_drain_recall_is_never_weakened() -> None:
    drain = p.Recall(claim="a", alias="m")
    ttl = p.Recall(claim="a", alias="m", kind="idle", idle=60)
    soon = p.Recall(claim="a", alias="m", kind="idle", idle=0)
    assert c.stronger(ttl, None) and c.stronger(drain, ttl) and c.stronger(soon, ttl)
    assert not c.stronger(ttl, drain) and not c.stronger(ttl, ttl)


def test_queued_adds_up_the_frontends_reports() -> None:
    assert c.queued_for("m", [{"m": 2}, {"m": 1, "n": 4}, {}]) == 3


def test_the_oldest_wait_is_the_earliest_of_the_frontends() -> None:
    assert c.queued_since("m", [{"m": 20.0}, {"m": 10.0, "n": 5.0}, {}]) == 10.0
    assert c.queued_since("x", [{"m": 20.0}]) is None


def test_an_unconfirmed_claim_counts_as_busy() -> None:
    assert rec("a", confirmed=False).counts_as == 1
    assert rec("a", confirmed=False, in_flight=3).counts_as == 3
    assert rec("a").counts_as == 0


def test_a_restored_claim_whose_frontend_is_gone_is_void_at_once() -> None:
    """Issue 43, item 11: the frontend's process, recorded with its claims (pid from
    SO_PEERCRED, start time from /proc), decides at a restart of ktd."""
    fe = c.FrontendProcess(pid=4242, start=1000)
    assert not c.void_at_restore(fe, 1000)  # still running: it will report
    assert c.void_at_restore(fe, None)  # no such process (or a zombie): gone
    assert c.void_at_restore(fe, 2000)  # its pid given to another process: gone
    assert not c.void_at_restore(None, None)  # unknown holder: lease_ttl to report
