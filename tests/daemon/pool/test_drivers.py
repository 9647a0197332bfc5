"""The daemon's admission and expiry drivers in-process: real ``Engine`` records, the real
``Gatekeeper``, ``ClaimTable`` and ``Sweeper``, on trio's virtual clock; a test plays the
supervisor (it moves the engine's state) and the clients. No process, no socket."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import claimsync as c
from ktd.core import states as S
from tests.daemon.inprocess import move


async def test_leases_wait_for_a_slot_in_arrival_order(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m", max_concurrent=1)
    move(e, S.READY, want_up=True)
    first = d.gate.grant_now(e, "a", claim=False)
    assert first is not None and e.in_flight() == 1
    order: list[str] = []

    async def want(client: str) -> None:
        await d.gate.acquire(e, client)
        order.append(client)

    async with trio.open_nursery() as n:
        n.start_soon(want, "b")
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(want, "c")
        await trio.testing.wait_all_tasks_blocked()
        assert e.queued() == 2 and order == []
        d.gate.release(first)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["b"]
        d.gate.release(next(iter(d.gate.leases)))
    assert order == ["b", "c"]


async def test_a_cold_engine_is_loaded_once_for_a_burst(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m")
    got: list[str] = []

    async def want(i: int) -> None:
        got.append(await d.gate.acquire(e, f"c{i}"))

    async with trio.open_nursery() as n:
        for i in range(3000):
            n.start_soon(want, i)
        await trio.testing.wait_all_tasks_blocked()
        assert e.want_up and e.queued() == 3000  # one launch asked for, all waiting
        move(e, S.STARTING)
        move(e, S.READY)
    assert len(set(got)) == 3000 and e.in_flight() == 3000


@pytest.mark.parametrize("recorded", [S.READY, S.DRAINING])
async def test_an_engine_being_adopted_is_running_before_its_supervisor_runs(
    daemon: Any, recorded: S.State, autojump_clock: trio.abc.Clock
) -> None:
    """Regression: between reading the state file and the supervisor's first step the
    control socket already serves, and it showed an adopted engine as ``stopped``: a
    status lied, and an evict in that window found nothing to stop (the engine served
    on). Shown as adopting at once; a request rides the adoption rather than launching
    a second engine; an evict then is what the supervisor finds; one the previous
    daemon was draining stays on its way down."""
    from ktd.daemon.engine.running import Running

    d = daemon()
    e = d.engine("m")
    e.begin_adoption(
        Running(pid=1, start=1, engine_id="old/m@1", port=8000, argv=[], adopted_state=recorded)
    )
    info = e.info()
    assert info.state == "starting" and e.adopting() and info.pid == 1
    assert e.want_up == (recorded == S.READY)
    if recorded == S.READY:
        with trio.move_on_after(1):
            await d.gate.acquire(e, "c")  # rides the adoption: still waiting
        assert e.state == S.STARTING and e.adopt is not None and e.want_up
        e.request_down()
        assert not e.want_up


async def test_a_failed_load_answers_its_waiters_with_its_reason(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m")
    errors: list[ControlError] = []

    async def want() -> None:
        try:
            await d.gate.acquire(e, "c")
        except ControlError as exc:
            errors.append(exc)

    async with trio.open_nursery() as n:
        n.start_soon(want)
        await trio.testing.wait_all_tasks_blocked()
        move(e, S.STARTING)
        e.reason = "crashed during load"
        move(e, S.FAILED, want_up=False)
    assert [x.message for x in errors] == ["crashed during load"]


async def test_a_timed_out_or_cancelled_request_leaves_the_line(
    daemon: Any, autojump_clock: trio.testing.MockClock
) -> None:
    d = daemon()
    e = d.engine("m")
    move(e, S.STARTING, want_up=True)
    with pytest.raises(ControlError) as err:
        await d.gate.acquire(e, "c", timeout=5)
    assert err.value.code == p.ErrorCode.TIMEOUT and not e.gate.line
    with trio.move_on_after(1):
        await d.gate.acquire(e, "c")
    assert not e.gate.line


async def test_claims_need_no_slot_and_their_reports_count(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m", max_concurrent=1)
    move(e, S.READY, want_up=True)
    lease = d.gate.grant_now(e, "tool", claim=False)
    assert lease is not None
    claim = d.gate.grant_now(e, "fe", claim=True)  # full for leases, not for a claim
    assert claim is not None and claim in e.claims
    report = p.Sync(
        client="fe",
        claims=[p.ClaimState(claim=claim, alias="m", url=e.url or "", in_flight=3)],
        daemon=d.claims.run,
        seen=1,
    )
    d.claims.report(report, d.host.engines)
    assert e.in_flight() == 4


async def test_the_ttl_recalls_a_claimed_engine_and_evicts_an_unheld_one(
    daemon: Any, autojump_clock: trio.testing.MockClock
) -> None:
    d = daemon(lease_ttl=30)
    held, free = d.engine("held", ttl=3), d.engine("free", ttl=3)
    move(held, S.READY, want_up=True)
    move(free, S.READY, want_up=True)
    claim = d.gate.grant_now(held, "fe", claim=True)
    assert claim is not None
    async with trio.open_nursery() as n:
        n.start_soon(d.sweeper.run)
        await trio.sleep(2.9)
        assert free.want_up and held.claims[claim].recall is None
        await trio.sleep(0.2)
        assert not free.want_up and free.down_reason == "idle for 3s (ttl)"
        recall = held.claims[claim].recall
        assert held.want_up and recall is not None and recall.kind == "idle"
        n.cancel_scope.cancel()


async def test_a_paused_daemon_expires_no_client_and_judges_no_ttl_until_it_hears(
    daemon: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """SIGSTOP, as the virtual clock sees it: time jumps while no task runs."""
    d = daemon(lease_ttl=6)
    e = d.engine("m", ttl=3)
    move(e, S.READY, want_up=True)
    claim = d.gate.grant_now(e, "fe", claim=True)
    assert claim is not None
    busy = p.Sync(
        client="fe",
        claims=[p.ClaimState(claim=claim, alias="m", url=e.url or "", in_flight=1)],
        daemon=d.claims.run,
        seen=1,
    )
    d.claims.report(busy, d.host.engines)
    async with trio.open_nursery() as n:
        n.start_soon(d.sweeper.run)
        await trio.sleep(1)
        autojump_clock.jump(20)  # the daemon was stopped for 20 s: longer than lease_ttl
        await trio.sleep(0.01)
        assert claim in e.claims and d.sweeper.expiry.paused == 1
        d.sweeper.heard("fe")  # the backlog: the frontend's heartbeats, read late
        await trio.sleep(1.9)
        assert claim in e.claims and e.want_up
        n.cancel_scope.cancel()


async def test_restored_claims_of_a_frontend_that_is_gone_are_void_at_once(daemon: Any) -> None:
    """Issue 43, item 11: each claim keeps its frontend's process (the pid the socket
    showed and its start time); a restarted daemon restores only those of frontends still
    running, so an idle engine whose frontend died with ktd is not held for lease_ttl."""
    d = daemon()
    live = {100: 7}  # pid -> start time: the processes running now
    d.claims._start_of = live.get
    e = d.engine("m")
    move(e, S.READY, want_up=True)
    d.claims.heard_from("fe-live", 100)
    d.claims.heard_from("fe-dead", 200)  # not running when first heard: not recorded
    assert d.claims.holders == {"fe-live": c.FrontendProcess(100, 7)}
    records = [
        ("c1", "fe-live", c.FrontendProcess(100, 7)),  # running: kept until it reports
        ("c2", "fe-gone", c.FrontendProcess(300, 5)),  # no such process now
        ("c3", "fe-reused", c.FrontendProcess(100, 6)),  # its pid is another process's now
        ("c4", "fe-old", None),  # a state file from before: lease_ttl, as ever
    ]
    assert d.claims.restore(e, records) == ["fe-live", "fe-old"]
    assert sorted(e.claims) == ["c1", "c4"]
    assert e.claims["c1"].holder == c.FrontendProcess(100, 7) and not e.claims["c1"].confirmed
