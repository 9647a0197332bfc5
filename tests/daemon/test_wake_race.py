"""Two sleep-enabled engines on one NUMA node, wanted in turn and at once, with slow and
varied releases and resumes (issue 40: under load, alternating requests left both
engines ``waking`` for good). The real pool in-process (``tests.daemon.inpool``) on
trio's virtual clock; hypothesis chooses when each request comes, how long it runs and
how long each of SGLang's memory calls takes.

After every schedule: every request was served (none waited past its bound), the two
engines were never awake on the node at once, SGLang's rules were never broken (no
release with a request running, no generation while released), and both engines came
to rest (ready or asleep, nobody waiting).

Then a third engine, stopped, whose first use is a cold load through the pool's
launcher (``inpool.StandIn``), interleaved with wakes and with a reload's restart: the
same checks, no node or GPU held by two engines at once, and every restart done."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import msgspec
import trio
import trio.testing
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from ktd.core import states as S
from ktd.core.config import Config
from tests.daemon.inpool import FakeSGLang, world
from tests.hypo import budget

ALIASES = ("a", "b")
BOUND = 900.0  # virtual seconds a request may wait: far above any schedule's need

requests = st.lists(
    st.tuples(
        st.sampled_from(ALIASES),
        st.floats(0, 40, allow_nan=False),  # when it comes
        st.floats(0, 6, allow_nan=False),  # how long it runs on the engine
    ),
    min_size=1,
    max_size=10,
)
durations = st.lists(st.floats(0.01, 8, allow_nan=False), min_size=1, max_size=6)


def _served(
    schedule: list[tuple[str, float, float]], releases: list[float], resumes: list[float]
) -> None:
    def fake(alias: str) -> FakeSGLang:
        rel, res = itertools.cycle(releases), itertools.cycle(resumes)
        return FakeSGLang(alias, release_time=lambda: next(rel), resume_time=lambda: next(res))

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            start = [("a", S.READY), ("b", S.ASLEEP)]
            async with world(Path(tmp), start, fakes=fake) as w:
                outcomes: list[tuple[str, str]] = []

                async def client(alias: str, at: float, hold: float) -> None:
                    await trio.sleep(at)
                    outcomes.append((alias, await w.use(alias, hold, timeout=BOUND)))

                with trio.move_on_after(BOUND * 2) as late:
                    async with trio.open_nursery() as n:
                        for alias, at, hold in schedule:
                            n.start_soon(client, alias, at, hold)
                    while any(e.state not in (S.READY, S.ASLEEP) for e in w.pool.engines.values()):
                        await trio.sleep(1)
                if late.cancelled_caught:  # say where each engine stands, and what it did
                    raise AssertionError(
                        f"not at rest after {BOUND * 2:g} s: "
                        + "; ".join(
                            f"{e.alias} {e.state} {e.phase} {e.reason!r} {e.log.last(12)}"
                            for e in w.pool.engines.values()
                        )
                        + f"; outcomes {outcomes}"
                    )
                assert [o for o in outcomes if o[1] != "ok"] == [], outcomes
                assert w.problems() == []
                for e in w.pool.engines.values():
                    assert not e.gate.line, f"{e.alias}: {len(e.gate.line)} still waiting"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@budget(40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=requests, releases=durations, resumes=durations)
def test_wakes_from_both_sides_are_all_served(
    schedule: list[tuple[str, float, float]], releases: list[float], resumes: list[float]
) -> None:
    _served(schedule, releases, resumes)


def test_requests_for_both_while_the_first_wake_puts_the_other_to_sleep() -> None:
    """The smallest schedule hypothesis found against the old placer: b's wake puts a to
    sleep while a's own requests arrive; a's wake then waited for b's and b's for a's."""
    schedule = [("b", 0.0, 1.7), ("a", 0.0, 0.001), ("a", 0.0, 6.0), ("a", 1.0, 0.0)]
    _served([*schedule, ("a", 32.6, 3.6), ("b", 40.0, 0.0)], [1.0], [1.0])


# ------------------------------------------------------------ with a cold load and a restart

COLD = ("a", "b", "c")  # a adopted ready, b adopted asleep, c stopped: its first use loads it


def _served_cold(
    schedule: list[tuple[str, float, float]],
    restart: tuple[str, float] | None,
    loads: list[float],
    memory_calls: list[float],
    *,
    bound: float = BOUND,
) -> list[str]:
    """The schedule run; the launches the pool made (checked: the invariants)."""

    def fake(alias: str) -> FakeSGLang:
        calls = itertools.cycle(memory_calls)
        return FakeSGLang(alias, release_time=lambda: next(calls), resume_time=lambda: next(calls))

    load = itertools.cycle(loads)
    launches: list[str] = []

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            start = [("a", S.READY), ("b", S.ASLEEP), ("c", S.STOPPED)]
            async with world(Path(tmp), start, fakes=fake, load_time=lambda: next(load)) as w:
                outcomes: list[tuple[str, str]] = []

                async def client(alias: str, at: float, hold: float) -> None:
                    await trio.sleep(at)
                    outcomes.append((alias, await w.use(alias, hold, timeout=bound)))

                async def reload(alias: str, at: float) -> None:
                    await trio.sleep(at)
                    cfg = w.pool.config
                    spec = msgspec.structs.replace(cfg.models[alias], ctx=16384)
                    models = {**cfg.models, alias: spec}
                    w.pool.apply_config(Config(path=cfg.path, file=cfg.file, models=models))

                def resting() -> bool:
                    return all(
                        e.state in (S.READY, S.ASLEEP, S.STOPPED) and e.pending_spec is None
                        for e in w.pool.engines.values()
                    )

                def told() -> str:
                    return "; ".join(
                        f"{e.alias} {e.state} {e.phase} {e.log.last(30)}"
                        for e in w.pool.engines.values()
                    )

                with trio.move_on_after(bound * 2) as late:
                    async with trio.open_nursery() as n:
                        for alias, at, hold in schedule:
                            n.start_soon(client, alias, at, hold)
                        if restart is not None:
                            n.start_soon(reload, *restart)
                    while not resting():
                        await trio.sleep(1)
                assert not late.cancelled_caught, f"not at rest: {outcomes}: {told()}"
                assert [o for o in outcomes if o[1] != "ok"] == [], f"{outcomes}: {told()}"
                assert w.problems() == []
                for e in w.pool.engines.values():
                    assert not e.gate.line, f"{e.alias}: {len(e.gate.line)} still waiting"
                    assert e.spec.ctx == (16384 if restart and restart[0] == e.alias else 32768)
                assert w.launcher is not None
                launches.extend(w.launcher.launches)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return launches


def test_a_restart_of_the_sleeper_during_a_cold_load_and_a_wake() -> None:
    """The interleaving spelled out: c's cold load takes the node from ready a, a reload
    changes asleep b's launch while c loads (b restarts: stopped, as it was not up), and
    a is wanted again while c still runs (a wake that waits for c)."""
    schedule = [("c", 0.0, 2.0), ("a", 5.0, 0.5), ("c", 6.0, 0.5)]
    launches = _served_cold(schedule, ("b", 1.0), [10.0], [1.0, 3.0])
    assert launches == ["c"], launches


def test_a_restart_during_a_wake_that_waits_for_room() -> None:
    """b's wake waits for room (a is ready and in use) when a reload changes b's launch:
    the restart's stop calls the wake off, which puts b back to sleep and settles its
    want to asleep over the restart's down; the restart waits for a stop that never
    comes and b's request (riding the restart) was never answered. Now a wake called off
    by a stop stays wanted down, is stopped asleep, and restarts."""
    _served_cold([("a", 0.0, 5.0), ("b", 0.1, 0.0)], ("b", 0.2), [0.0], [1.0], bound=60.0)


# Many at once and many that end at once: the races are between placements that start
# or find their holder idle at the same virtual instant.
cold_requests = st.lists(
    st.tuples(
        st.sampled_from(COLD),
        st.just(0.0) | st.floats(0, 30, allow_nan=False),  # when it comes
        st.just(0.0) | st.floats(0, 5, allow_nan=False),  # how long it runs on the engine
    ),
    min_size=3,
    max_size=12,
)


@budget(20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=cold_requests,
    restart=st.none() | st.tuples(st.sampled_from(COLD), st.floats(0, 30, allow_nan=False)),
    loads=st.lists(st.just(0.0) | st.floats(0, 20, allow_nan=False), min_size=1, max_size=3),
    memory_calls=st.lists(st.floats(0.01, 6, allow_nan=False), min_size=1, max_size=4),
)
def test_wakes_with_a_cold_load_and_a_restart_are_all_served(
    schedule: list[tuple[str, float, float]],
    restart: tuple[str, float] | None,
    loads: list[float],
    memory_calls: list[float],
) -> None:
    """Three engines on one node (a ready, b asleep, c stopped), wanted in any order,
    with a reload's restart of any of them at any time: every request is served within
    the bound, no two are awake on the node at once, every restart is done."""
    _served_cold(schedule, restart, loads, memory_calls)


def test_three_engines_that_put_each_other_to_sleep_serve_the_oldest_wake_in_turn() -> None:
    """What hypothesis found against the old placer: a, b and c wanted at once, each
    placement that found its holder idle first took the room, so the engines took turns
    putting each other to sleep and c's cold load (the oldest) waited past the bound.
    Placements that need room now take turns in arrival order (``core.roomline``)."""
    schedule = [("a", 2.86, 0.0), ("a", 21.2, 0.0), ("a", 0.1, 0.0), ("a", 26.0, 0.0)]
    schedule += [("c", 0.0, 0.0), ("a", 0.0, 4.35), ("b", 22.5, 0.0), ("b", 0.0, 0.0)]
    schedule += [("a", 12.2, 0.0), ("a", 0.0, 0.0), ("b", 0.0, 0.0)]
    _served_cold(schedule, None, [0.0], [0.01])


def test_a_cold_load_that_needs_the_room_of_an_engine_restarting_waits_for_its_stop() -> None:
    """A reload restarts idle a just as c's cold load wants a's room. The load used to
    evict a, which put it to sleep: the restart waited for a stop that never came. Now
    the load waits for a's stop, and a restarts with the new launch (it was up: it comes
    back once c is idle)."""
    launches = _served_cold([("c", 0.05, 1.0)], ("a", 0.05), [0.0], [1.0], bound=60.0)
    assert launches == ["c", "a"], launches


def test_a_restart_of_an_asleep_engine_with_a_request_stops_it_then_loads_it() -> None:
    """c's cold load puts a to sleep, a reload restarts asleep a, and a request for a
    comes during the restart's stop. The request used to call the stop off (it woke a
    with the old launch, and the restart waited for a stop that never came); now the
    stop ends and the request loads a with the new launch."""
    launches = _served_cold([("c", 0.0, 1.0), ("a", 0.5, 0.0)], ("a", 0.2), [0.0], [1.0])
    assert launches == ["c", "a"], launches
