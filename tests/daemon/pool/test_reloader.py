"""The reloader in-process: a reload plan carried out on real ``Engine`` records, the
test playing the supervisor (``move``) on trio's virtual clock. No process, no socket."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from ktd.core import states as S
from ktd.core.config import ModelSpec
from ktd.daemon.pool.reloader import Reloader
from tests.daemon.inprocess import Daemon, move
from tests.fixtures.specs import kt_spec


class Bench:
    """A reloader wired as the pool wires it, recording what it asked of the pool."""

    def __init__(self, d: Daemon, nursery: trio.Nursery) -> None:
        self.d = d
        self.added: list[str] = []
        self.recalled: list[tuple[str, str]] = []
        self.probes_forgotten = 0
        self.reloader = Reloader(
            d.host.engines,
            add_engine=lambda spec: self.added.append(spec.alias),
            start_soon=nursery.start_soon,
            recall_idle=lambda e, why: self.recalled.append((e.alias, why)),
            forget_probes=self.forget,
        )

    def forget(self) -> None:
        self.probes_forgotten += 1

    def reload(self, *specs: ModelSpec) -> str:
        return self.reloader.apply({s.alias: s for s in specs})


async def test_each_kind_of_change_is_carried_out(daemon: Any) -> None:
    d = daemon()
    same, changed, gone = d.engine("same"), d.engine("changed"), d.engine("gone")
    for e in (same, changed, gone):
        move(e, S.READY, want_up=True)
    async with trio.open_nursery() as n:
        b = Bench(d, n)
        summary = b.reload(
            same.spec,
            kt_spec(alias="changed", ctx=8192),
            kt_spec(alias="new"),
        )
        assert b.probes_forgotten == 1
        assert b.added == ["new"]
        assert "added: new" in summary and "removed: gone" in summary
        assert "restarting: changed" in summary
        assert gone.retired and not gone.want_up
        await trio.testing.wait_all_tasks_blocked()
        # The restart waits for the claims' holders: recalled first, idle at once here.
        assert b.recalled == [("changed", "restart after reload")]
        assert not changed.want_up and changed.restarting
        move(changed, S.STOPPED)
        await trio.testing.wait_all_tasks_blocked()
        assert changed.want_up and not changed.restarting and changed.spec.ctx == 8192
        assert same.want_up and same.pending_spec is None
        move(gone, S.STOPPED)
        gone.finished = True
        gone.notify_changed()
    assert "gone" not in d.host.engines  # forgotten once stopped and its task ended


async def test_an_evict_during_the_restart_wins(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m")
    move(e, S.STARTING, want_up=True)
    async with trio.open_nursery() as n:
        b = Bench(d, n)
        b.reload(kt_spec(alias="m", ctx=8192))
        await trio.testing.wait_all_tasks_blocked()
        assert e.restarting
        e.request_down(reason="evicted")  # ktctl evict, while it stops for the restart
        move(e, S.STOPPED)
        await trio.testing.wait_all_tasks_blocked()
    assert not e.want_up and not e.restarting and e.spec.ctx == 8192


async def test_a_busy_engine_is_stale_until_its_requests_end(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m", max_concurrent=4)
    move(e, S.READY, want_up=True)
    lease = d.gate.grant_now(e, "client", claim=False)
    assert lease is not None
    async with trio.open_nursery() as n:
        b = Bench(d, n)
        assert "stale until idle: m" in b.reload(kt_spec(alias="m", ctx=8192))
        await trio.testing.wait_all_tasks_blocked()
        assert e.stale and e.want_up  # serving on, with the old launch
        d.gate.release(lease)
        await trio.testing.wait_all_tasks_blocked()
        assert not e.want_up  # idle: down for the restart
        move(e, S.STOPPED)
        await trio.testing.wait_all_tasks_blocked()
    assert e.want_up and not e.stale and e.spec.ctx == 8192


async def test_a_later_reload_back_to_what_runs_cancels_the_restart(daemon: Any) -> None:
    d = daemon()
    e = d.engine("m", max_concurrent=4)
    move(e, S.READY, want_up=True)
    first = e.spec
    lease = d.gate.grant_now(e, "client", claim=False)
    assert lease is not None
    async with trio.open_nursery() as n:
        b = Bench(d, n)
        b.reload(kt_spec(alias="m", ctx=8192))
        assert b.reload(first) == "no changes" and e.pending_spec is None and not e.stale
        d.gate.release(lease)
        await trio.testing.wait_all_tasks_blocked()
    assert e.want_up and e.state == S.READY and e.spec is first
