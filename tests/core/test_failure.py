"""The failed reason names the first real error, not SGLang's "see the messages above"."""

from __future__ import annotations

from ktd.core.failure import first_error, reason_line

INIT_FAILED = "[2026-12-01 10:00:05] Initialization failed. Please see the error messages above."


def test_traceback_last_line_wins_over_initialization_failed() -> None:
    tail = [
        "[2026-12-01 10:00:00] server_args=ServerArgs(...)",
        "Traceback (most recent call last):",
        '  File "/venv/site-packages/kt_kernel/experts_base.py", line 88, in __init__',
        "    per_pool = cpuinfer_threads // threadpool_count",
        "TypeError: unsupported operand type(s) for //: 'NoneType' and 'int'",
        INIT_FAILED,
    ]
    assert first_error(tail).startswith("TypeError: unsupported operand")


def test_cuda_oom_named_even_when_not_last() -> None:
    tail = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "Exception in scheduler: ...",
        INIT_FAILED,
    ]
    assert "CUDA out of memory" in first_error(tail)


def test_unrecognized_arguments() -> None:
    tail = [
        "usage: launch_server.py [-h] --model-path MODEL_PATH ...",
        "launch_server.py: error: unrecognized arguments: --kt-numa-nodes 0",
    ]
    assert "unrecognized arguments: --kt-numa-nodes 0" in first_error(tail)


def test_ktd_notes_and_vague_lines_skipped_and_earlier_attempts_ignored() -> None:
    tail = [
        "[ktd] starting: python -m sglang.launch_server ...",
        "RuntimeError: from an earlier attempt",
        "[ktd] starting: python -m sglang.launch_server ...",
        "[2026] Load weight begin",
        INIT_FAILED,
        "[ktd] stopped (pid 12, exit 1)",
    ]
    reason = reason_line("exited with code 1", tail, "/var/lib/ktd/logs/m.log")
    assert "earlier attempt" not in reason
    assert reason == (
        "engine exited with code 1 before it was ready: [2026] Load weight begin "
        "(log: /var/lib/ktd/logs/m.log)"
    )


def test_empty_tail() -> None:
    assert first_error([]) == ""
    assert reason_line("was killed by SIGKILL", [], "/l").endswith("ready (log: /l)")
