"""Exit classification alone: an exit code and a log tail in, an outcome out."""

from __future__ import annotations

import signal

import pytest

from ktd.core.exits import CLEAN_STOP, classify_exit, describe_exit, signal_name


def classify(
    code: int | None, *, ready: bool = False, fixed: bool = False, tail: list[str] | None = None
) -> tuple[str, str | None]:
    out = classify_exit(
        code, was_ready=ready, port=30001, port_fixed=fixed, tail=tail or [], log_path="/l/m.log"
    )
    return out.kind, out.reason


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (None, "exited"),
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (-9, "was killed by SIGKILL"),
        (-999, "was killed by 999"),
    ],
)
def test_describe_exit(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_signal_name() -> None:
    assert signal_name(15) == "SIGTERM" and signal_name(999) == "999"


def test_clean_exit_of_a_ready_engine_is_no_crash() -> None:
    assert classify(0, ready=True) == ("exited", "engine exited with code 0 on its own while ready")


@pytest.mark.parametrize("code", [1, -9, None])
def test_other_exits_of_a_ready_engine_are_crashes(code: int | None) -> None:
    kind, reason = classify(code, ready=True, tail=["OSError: address already in use"])
    assert kind == "crashed" and reason is not None and reason.endswith("while ready")


def test_port_taken_before_ready_is_retried_only_for_a_picked_port() -> None:
    tail = ["ERROR: [Errno 98] error while attempting to bind: address already in use"]
    assert classify(1, tail=tail) == (
        "port_taken",
        "port 30001 was taken before the engine bound it",
    )
    assert classify(1, fixed=True, tail=tail)[0] == "failed"


def test_a_port_marker_beyond_the_last_40_lines_does_not_count() -> None:
    tail = ["OSError: [Errno 98] address already in use", *(["loading"] * 40)]
    assert classify(1, tail=tail)[0] == "failed"


def test_a_failed_load_names_the_first_real_error_and_the_log() -> None:
    tail = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "Initialization failed. Please see the error messages above.",
    ]
    kind, reason = classify(1, tail=tail)
    assert kind == "failed" and reason is not None
    assert reason.startswith("engine exited with code 1 before it was ready: ")
    assert "CUDA out of memory" in reason and "/l/m.log" in reason


def test_sglang_stops_after_sigterm_are_clean() -> None:
    # 137: the kt fork's own SIGKILL after its drain, reported by a wrapper shell.
    assert {0, -signal.SIGTERM, 143, -signal.SIGKILL, 137} == set(CLEAN_STOP)
    assert 1 not in CLEAN_STOP
