"""The placer in-process: real ``Engine`` records, the real ``Gatekeeper`` and ``Placer``
on a one-node machine, trio's virtual clock; the test plays the supervisors (it moves
the holders' states). What a swap does to the engines in its way: an idle holder is
stopped (or put to sleep), a busy one yields and is waited for, a pinned one refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from ktd.core import states as S
from ktd.core.states import Phase, Step
from ktd.daemon.engine.engine import Busy, Engine
from ktd.daemon.engine.running import Running
from ktd.daemon.pool.placer import Placer
from tests.daemon.engine.test_preflight import GIB, safetensors, sparse
from tests.daemon.inprocess import Daemon, inline, move
from tests.fixtures.topology import ONE_NODE, build_xeon, smi_script


class Placing:
    def __init__(self, d: Daemon) -> None:
        self.d = d
        self.recalls: list[tuple[str, str]] = []
        self.placer = Placer(
            d.host.engines,
            lambda: d.host.settings,
            ticket=d.gate.ticket,
            update=d.gate.update,
            recall=lambda e, why: self.recalls.append((e.alias, why)),
            offload=inline,
        )
        self.placer.refresh_topology(ONE_NODE)
        changed = d.host.engine_changed

        def engine_changed(e: Engine) -> None:  # as the pool: the placer looks again
            changed(e)
            self.placer.poke()

        d.host.engine_changed = engine_changed  # type: ignore[method-assign,assignment]

    def holder(self, alias: str, **spec: Any) -> Engine:
        """A ready engine holding the machine's node and GPU."""
        e = self.d.engine(alias, fit="ignore", **spec)
        e.plan = self.placer.make_plan(e.spec, exclude=e)
        assert e.plan.ok, e.plan.reason
        move(e, S.READY, want_up=True)
        return e

    def wanted(self, alias: str) -> Engine:
        """An engine its supervisor is placing: wanted up, not yet started."""
        e = self.d.engine(alias, fit="ignore")
        e.want_up = True
        return e


@pytest.fixture
def placing(daemon: Callable[..., Daemon]) -> Callable[[], Placing]:
    return lambda: Placing(daemon())


async def _placed(p: Placing, engine: Engine, until: Callable[[], None]) -> Any:
    """``engine`` placed while ``until`` (the supervisors' part) runs once it waits."""
    got: list[Any] = []

    async def place() -> None:
        got.append(await p.placer.place(engine))

    async with trio.open_nursery() as n:
        n.start_soon(place)
        await trio.testing.wait_all_tasks_blocked()
        until()
    return got[0]


async def test_an_idle_holder_is_stopped_and_the_plan_takes_its_node(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a")
    b = p.wanted("b")

    def supervisor() -> None:
        assert a.want == a.want.DOWN and a.down_reason == "evicted to make room for b"
        assert b.phase is not None and b.phase.step == Step.MAKING_ROOM
        move(a, S.STOPPED)

    plan = await _placed(p, b, supervisor)
    assert plan.ok and plan.numa_nodes == (0,) and plan.gpus == (0,)
    assert b.stats.made_room == ("a",) and b.stats.owed and a.stats.evictions == 1


async def test_a_holder_that_sleeps_is_put_to_sleep_not_stopped(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a", sleep=True)
    a.run = Running(pid=1, start=1, engine_id="t/a@1", port=8000, argv=[])
    a.sleeps = True
    b = p.wanted("b")

    def supervisor() -> None:
        assert a.want == a.want.ASLEEP and a.down_reason == "put to sleep to make room for b"
        move(a, S.ASLEEP)

    plan = await _placed(p, b, supervisor)
    assert plan.ok and b.stats.made_room == ()  # nothing to bring back: it sleeps


async def test_a_busy_holder_yields_is_recalled_and_waited_for(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a")
    lease = p.d.gate.grant_now(a, "client", claim=False)
    assert lease is not None
    b = p.wanted("b")

    def supervisor() -> None:
        assert p.recalls == [("a", "yielding to b")]
        assert b.phase is not None and b.phase.step == Step.WAITING
        assert a.want == a.want.UP  # still serving its request
        p.d.gate.release(lease)  # the request ends; the swap goes on

    got: list[Any] = []

    async def place() -> None:
        got.append(await p.placer.place(b))

    async with trio.open_nursery() as n:
        n.start_soon(place)
        await trio.testing.wait_all_tasks_blocked()
        supervisor()
        await trio.testing.wait_all_tasks_blocked()
        assert a.want == a.want.DOWN
        move(a, S.STOPPED)
    assert got[0].ok and b.stats.made_room == ("a",)


async def test_a_pinned_holder_is_never_evicted(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a", pinned=True)
    b = p.wanted("b")
    with pytest.raises(Busy):
        await p.placer.place(b)
    assert a.want == a.want.UP and a.stats.evictions == 0


async def test_a_failed_load_brings_back_what_it_stopped(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a")
    b = p.wanted("b")
    await _placed(p, b, lambda: move(a, S.STOPPED))
    a.want_up = False
    assert p.placer.bring_back(b) == ("a",)
    assert a.want == a.want.UP
    assert p.placer.bring_back(b) == ()  # owed once


async def test_a_load_called_off_while_it_waits_lets_the_holder_serve_again(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    p = placing()
    a = p.holder("a")
    assert p.d.gate.grant_now(a, "client", claim=False) is not None
    b = p.wanted("b")

    def called_off() -> None:
        assert a.gate.cutoff is not None  # yielding: newcomers wait behind the swap
        b.want_up = False
        b.notify_changed()

    assert await _placed(p, b, called_off) is None
    assert a.gate.cutoff is None and a.want == a.want.UP and a.stats.evictions == 0


def _asleep(p: Placing, alias: str) -> Engine:
    """A sleep-enabled engine asleep on the machine's node (its process pinned there)."""
    e = p.holder(alias, sleep=True)
    e.run = Running(pid=1, start=1, engine_id=f"t/{alias}@1", port=8000, argv=[])
    e.sleeps = True
    move(e, S.ASLEEP, want_up=False)
    return e


def _waking(e: Engine) -> None:
    """What its supervisor does when a request wants it: waking, room to make."""
    e.want_up = True
    e.state = S.WAKING
    e.set_phase(Phase.of(Step.PLACING))


async def test_two_wakes_on_one_node_never_wait_on_each_other(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    """Both asleep on node 0 and both wanted at once (issue 40): the first to take the
    placement lock makes the room its own; the other waits for it to serve and go idle,
    then puts it to sleep and wakes. (Each counting the other's unfinished wake as a busy
    holder made both wait for ever, both shown waking.)"""
    p = placing()
    a, b = _asleep(p, "a"), _asleep(p, "b")
    done: dict[str, str | None] = {}

    async def wake(e: Engine) -> None:
        done[e.alias] = await p.placer.make_room(e)

    with trio.fail_after(120):
        async with trio.open_nursery() as n:
            for e in (a, b):
                _waking(e)
                n.start_soon(wake, e)
            await trio.testing.wait_all_tasks_blocked()
            assert len(done) == 1 and None in done.values(), done
            first = p.d.host.engines[next(iter(done))]
            second = b if first is a else a
            assert first.phase is not None and first.phase.step == Step.RESUMING
            assert second.phase is not None and second.phase.waiting_for() == (first.alias,)
            move(first, S.READY)  # its supervisor resumed and checked it
            await trio.testing.wait_all_tasks_blocked()
            assert first.want == first.want.ASLEEP  # idle: put to sleep for the other
            move(first, S.ASLEEP)
    assert done == {"a": None, "b": None}
    assert second.phase is not None and second.phase.step == Step.RESUMING


async def test_a_victim_woken_again_at_once_does_not_take_the_room_back(
    placing: Callable[[], Placing], autojump_clock: trio.abc.Clock
) -> None:
    """b's wake puts the idle a to sleep; a request for a wakes it again before b has
    the room. b keeps the placement lock from the eviction to the room it takes, so a's
    wake finds b holding and waits (before, a took the freed room first, b put a to
    sleep again, and so on)."""
    p = placing()
    a = p.holder("a", sleep=True)
    a.run = Running(pid=1, start=1, engine_id="t/a@1", port=8000, argv=[])
    a.sleeps = True
    b = _asleep(p, "b")
    done: dict[str, str | None] = {}

    async def wake(e: Engine) -> None:
        done[e.alias] = await p.placer.make_room(e)

    with trio.fail_after(120):
        async with trio.open_nursery() as n:
            _waking(b)
            n.start_soon(wake, b)
            await trio.testing.wait_all_tasks_blocked()
            assert a.want == a.want.ASLEEP
            move(a, S.ASLEEP)
            _waking(a)  # a request for a, at once
            n.start_soon(wake, a)
            await trio.testing.wait_all_tasks_blocked()
            assert done == {"b": None} and b.phase is not None
            assert b.phase.step == Step.RESUMING
            assert a.phase is not None and a.phase.waiting_for() == ("b",)
            move(b, S.READY)
            await trio.testing.wait_all_tasks_blocked()
            move(b, S.ASLEEP)
    assert done == {"a": None, "b": None}


async def _until(done: Callable[[], bool]) -> None:
    """On the real clock: the memory fit runs in a thread (no virtual time here)."""
    with trio.fail_after(60):
        while not done():
            await trio.sleep(0.01)


def _model(root: Path, alias: str, gpu_gib: int) -> dict[str, Any]:
    """A sleep-enabled model whose files say ``gpu_gib`` of GPU weights and 10 GiB of
    experts (sparse files: only their sizes are read)."""
    model = root / alias
    safetensors(model / "model.safetensors", {"lm_head.weight": gpu_gib * GIB})
    (model / "config.json").write_text(json.dumps({"hidden_size": 64}))
    sparse(root / f"{alias}-kt" / "experts.bin", 10 * GIB)
    return {"path": str(model), "kt_weight_path": str(root / f"{alias}-kt"), "sleep": True}


@pytest.fixture
def gpu_78_of_80_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine's memory as the fit reads it: one GPU with 2 GiB free."""
    monkeypatch.setenv("KTD_SYSFS_ROOT", str(build_xeon(tmp_path / "sysfs")))
    smi = smi_script(tmp_path / "nvidia-smi", [(0, "G", 80 * 1024, 78 * 1024)])
    monkeypatch.setenv("KTD_NVIDIA_SMI", str(smi))
    return tmp_path


async def test_a_wake_that_does_not_fit_stops_the_least_recently_used_sleeper_first(
    placing: Callable[[], Placing], gpu_78_of_80_used: Path
) -> None:
    """Issue 40: a wake is fitted like a load, before anything is put to sleep: b needs
    40 GiB less its residue; a's sleep frees 20 GiB less its residue, 2 GiB are free: short.
    The least recently used sleeper, c, holds 20 GiB of residue (graphs captured outside
    the saver): stopped first, then the wake goes on. Never found out by a failed resume."""
    p = placing()
    root = gpu_78_of_80_used
    a = p.holder("a", **_model(root, "a", 20))
    a.run = Running(pid=1, start=1, engine_id="t/a@1", port=8000, argv=[])
    a.sleeps = True
    b = _asleep(p, "b")
    b.spec = msgspec.structs.replace(b.spec, **_model(root, "b", 40), fit="check")
    c = _asleep(p, "c")
    c.gpu_residue = {0: 20 * GIB}
    c.idle_since = -100.0  # used longest ago
    done: list[str | None] = []

    async def wake() -> None:
        done.append(await p.placer.make_room(b))

    async with trio.open_nursery() as n:
        _waking(b)
        n.start_soon(wake)
        await _until(lambda: c.down_reason is not None)  # the fit runs in a thread
        assert c.want == c.want.DOWN and "make room in memory for b" in (c.down_reason or "")
        assert a.want == a.want.UP  # nothing put to sleep before the fit was made
        move(c, S.STOPPED)
        await _until(lambda: a.want == a.want.ASLEEP)
        move(a, S.ASLEEP)
    assert done == [None]


async def test_a_wake_that_cannot_fit_stays_asleep_and_says_why(
    placing: Callable[[], Placing], gpu_78_of_80_used: Path
) -> None:
    p = placing()
    root = gpu_78_of_80_used
    a = p.holder("a", **_model(root, "a", 20))
    b = _asleep(p, "b")
    b.spec = msgspec.structs.replace(b.spec, **_model(root, "b", 40), fit="check")
    _waking(b)
    why = await p.placer.make_room(b)
    assert why is not None and "does not fit" in why and "GPU 0" in why
    assert a.want == a.want.UP and a.stats.evictions == 0  # untouched
