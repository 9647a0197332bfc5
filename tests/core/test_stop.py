"""The stop sequence (``ktd.core.stop``): unit tests of the machine and of the choice of
SGLang's server process, and a model-based test that runs the machine against a
simulated process tree with a fake clock."""

from __future__ import annotations

import signal

import pytest

from ktd.core.stop import (
    FOLLOW,
    KILL_BOUND,
    Done,
    ObserveAt,
    Observed,
    Scan,
    Send,
    StopMachine,
    StopPhase,
    Target,
    find_server,
    launch_tail,
)

TERM, KILL = signal.SIGTERM, signal.SIGKILL
T0 = 100.0


def run_script(m: StopMachine, script: list[tuple[Observed, object]]) -> None:
    """Feed each observation; the machine must answer the action given with it."""
    for seen, want in script:
        assert m.step(seen) == want, (seen, m.phase)


def test_a_server_that_drains_alone_ends_with_a_clean_stop() -> None:
    m = StopMachine(30)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=2, full=True), Send(TERM, Target.SERVER)),
            (Observed(T0, server=True, others=2), ObserveAt(T0 + 30, on_server=True)),
            (Observed(T0 + 4, server=True, others=2), ObserveAt(T0 + 30, on_server=True)),
            # Its children went with it (PDEATHSIG): a full scan has the last word.
            (Observed(T0 + 5, server=False, others=0), Scan()),
            (Observed(T0 + 5, server=False, others=0, full=True), Done(True, False)),
        ],
    )
    assert m.phase is StopPhase.DONE


def test_what_the_server_leaves_gets_sigterm_then_sigkill_after_the_follow_window() -> None:
    m = StopMachine(30)
    left = f"left {FOLLOW:g}s after the server exited"
    run_script(
        m,
        [
            (Observed(T0, server=True, others=1, full=True), Send(TERM, Target.SERVER)),
            # The server is gone at once; its helper is not: no wait for the grace.
            (Observed(T0 + 0.2, server=False, others=1), Scan()),
            (Observed(T0 + 0.2, server=False, others=1, full=True), Send(TERM, Target.REST)),
            (
                Observed(T0 + 0.2, server=False, others=1),
                ObserveAt(T0 + 0.2 + FOLLOW, on_server=False),
            ),
            (Observed(T0 + 0.2 + FOLLOW, server=False, others=1), Send(KILL, Target.REST, left)),
            (Observed(T0 + 3.3, server=False, others=0), Scan()),
            (Observed(T0 + 3.3, server=False, others=0, full=True), Done(True, True)),
        ],
    )


def test_a_helper_that_honours_sigterm_is_not_killed() -> None:
    m = StopMachine(30)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=1, full=True), Send(TERM, Target.SERVER)),
            (Observed(T0 + 1, server=False, others=1, full=True), Send(TERM, Target.REST)),
            (Observed(T0 + 1, server=False, others=0), Scan()),
            (Observed(T0 + 1, server=False, others=0, full=True), Done(True, False)),
        ],
    )


def test_a_server_that_ignores_sigterm_is_killed_with_everything_when_the_grace_ends() -> None:
    m = StopMachine(2)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=3, full=True), Send(TERM, Target.SERVER)),
            (Observed(T0 + 1.9, server=True, others=3), ObserveAt(T0 + 2, on_server=True)),
            (Observed(T0 + 2, server=True, others=3), Send(KILL, Target.ALL, "left after 2s")),
            (
                Observed(T0 + 2, server=True, others=1),
                ObserveAt(T0 + 2 + KILL_BOUND, on_server=False),
            ),
            (Observed(T0 + 2.1, server=False, others=0), Scan()),
            (Observed(T0 + 2.1, server=False, others=0, full=True), Done(True, True)),
        ],
    )


def test_grace_zero_kills_everything_at_once() -> None:
    m = StopMachine(0)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=2, full=True), Send(KILL, Target.ALL)),
            (Observed(T0, server=False, others=0), Scan()),
            (Observed(T0, server=False, others=0, full=True), Done(False, True)),
        ],
    )


def test_nothing_alive_is_a_stop_without_signals() -> None:
    for grace in (0, 30):
        m = StopMachine(grace)
        assert m.step(Observed(T0, server=False, others=0)) == Scan()
        assert m.step(Observed(T0, server=False, others=0, full=True)) == Done(False, False)


def test_a_crashed_server_s_leftovers_get_the_follow_window() -> None:
    m = StopMachine(30)
    run_script(
        m,
        [
            (Observed(T0, server=False, others=2, full=True), Send(TERM, Target.REST)),
            (Observed(T0, server=False, others=2), ObserveAt(T0 + FOLLOW, on_server=False)),
        ],
    )


def test_late_forks_found_by_the_confirming_scan_are_signalled() -> None:
    m = StopMachine(30)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=0, full=True), Send(TERM, Target.SERVER)),
            (Observed(T0 + 1, server=False, others=0), Scan()),
            # Forked while the server drained: the rest's SIGTERM reaches it too.
            (Observed(T0 + 1, server=False, others=1, full=True), Send(TERM, Target.REST)),
            (Observed(T0 + 1, server=False, others=0), Scan()),
            (Observed(T0 + 1.5, server=False, others=1, full=True), Send(TERM, Target.REST)),
            (
                Observed(T0 + 1.5, server=False, others=1),
                ObserveAt(T0 + 1 + FOLLOW, on_server=False),
            ),
        ],
    )
    k = StopMachine(0)
    run_script(
        k,
        [
            (Observed(T0, server=True, others=1, full=True), Send(KILL, Target.ALL)),
            (Observed(T0, server=False, others=0), Scan()),
            (Observed(T0, server=False, others=1, full=True), Send(KILL, Target.ALL)),
            (Observed(T0, server=False, others=1), ObserveAt(T0 + KILL_BOUND, on_server=False)),
        ],
    )


def test_the_kill_bound_ends_a_stop_with_what_is_left() -> None:
    m = StopMachine(0, kill_bound=5)
    run_script(
        m,
        [
            (Observed(T0, server=True, others=0, full=True), Send(KILL, Target.ALL)),
            (Observed(T0 + 1, server=True, others=0), ObserveAt(T0 + 5, on_server=False)),
            # A last scan: what forked meanwhile gets its SIGKILL before ktd gives up.
            (Observed(T0 + 5, server=True, others=0), Scan()),
            (Observed(T0 + 5, server=True, others=1, full=True), Send(KILL, Target.ALL)),
            (Observed(T0 + 5, server=True, others=0), Done(False, True, left=True)),
        ],
    )
    with pytest.raises(RuntimeError):
        m.step(Observed(T0 + 6, server=False, others=0))


def test_the_bound_is_grace_plus_follow_plus_kill_bound() -> None:
    m = StopMachine(30, follow=2, kill_bound=7)
    m.step(Observed(T0, server=True, others=0, full=True))
    assert m.bound() == T0 + 39
    z = StopMachine(-1, follow=2, kill_bound=7)
    z.step(Observed(T0, server=True, others=0, full=True))
    assert z.bound() == T0 + 9


# ---------------------------------------------------------------- the server process

LAUNCH = ["/opt/env/bin/python", "-m", "sglang.launch_server", "--port", "3000", "--x"]
ARGS = LAUNCH[1:]


def test_launch_tail_starts_at_the_module_flag() -> None:
    assert launch_tail(LAUNCH) == tuple(ARGS)
    assert launch_tail(["/bin/sh", "/opt/wrap", *ARGS]) == tuple(ARGS)
    assert launch_tail(["python", "serve.py", "--port", "1"]) == ("serve.py", "--port", "1")
    assert launch_tail([]) == ()


def test_without_a_wrapper_the_main_process_is_the_server() -> None:
    rows = [
        (10, 1, LAUNCH),
        (11, 10, ["sglang::scheduler"]),
        (12, 10, ["sglang::detokenizer"]),
        (13, 10, ["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"]),
    ]
    assert find_server(rows, 10, LAUNCH) == 10


def test_a_wrapper_shell_that_does_not_exec_is_passed_over() -> None:
    rows = [
        (10, 1, ["/bin/sh", "/opt/py-wrapper", *ARGS]),  # its own cmdline ends the same
        (20, 10, ["/opt/env/bin/python3.11", *ARGS]),
        (21, 20, ["sglang::scheduler"]),
    ]
    assert find_server(rows, 10, ["/opt/py-wrapper", *ARGS]) == 20
    # An adopted engine without a state record: its argv is the wrapper's cmdline.
    assert find_server(rows, 10, ["/bin/sh", "/opt/py-wrapper", *ARGS]) == 20


def test_nested_wrappers_pick_the_deepest() -> None:
    rows = [
        (10, 1, ["/bin/bash", "/opt/outer", *ARGS]),
        (11, 10, ["/bin/sh", "/opt/inner", *ARGS]),
        (12, 11, ["python", *ARGS]),
        (13, 12, ["python", "-c", "from multiprocessing.spawn import spawn_main"]),
    ]
    assert find_server(reversed(rows), 10, ["/opt/outer", *ARGS]) == 12


def test_a_fork_of_the_server_is_not_the_server() -> None:
    rows = [(10, 1, LAUNCH), (11, 10, LAUNCH), (12, 11, ["sglang::scheduler"])]
    assert find_server(rows, 10, LAUNCH) == 10


def test_no_match_falls_back_to_the_main_process() -> None:
    rows = [(10, 1, ["sglang::scheduler"]), (11, 10, ["sleep", "9"])]
    assert find_server(rows, 10, LAUNCH) == 10
    assert find_server([], 10, LAUNCH) == 10
    assert find_server(rows, 10, ["python"]) == 10  # nothing to match on
    # The arguments alone (no interpreter before them) are not a launch.
    assert find_server([(10, 1, ARGS)], 10, LAUNCH) == 10


def test_a_match_outside_the_main_process_tree_still_counts() -> None:
    """The wrapper died and the server was re-parented to ktd: still the server."""
    rows = [(20, 999, ["/opt/env/bin/python", *ARGS]), (21, 20, ["sglang::scheduler"])]
    assert find_server(rows, 10, ["/opt/py-wrapper", *ARGS]) == 20
