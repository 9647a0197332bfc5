"""The harness itself: what the processes a test starts inherit."""

from __future__ import annotations

import pytest

from tests.conftest import MARK, own_env


def test_the_callers_own_engine_variables_stay_out(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {
        "KTD_REAL_CACHE": "/somewhere",
        "CUDA_VISIBLE_DEVICES": "3",
        "SGLANG_ENABLE_TORCH_COMPILE": "1",
        "KT_KERNEL_DEBUG": "1",
    }
    for name, value in gone.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HARNESS_PROBE", "kept")
    env = own_env()
    assert not gone.keys() & env.keys()
    assert env["HARNESS_PROBE"] == "kept"
    assert env[MARK]  # the leak check's marker is what every child must keep
