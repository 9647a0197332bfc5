"""The out-of-memory retry of a derived ``--kt-num-gpu-experts`` through a real daemon
(issue 44 item 6): a catalog-written entry whose derived count is more than the sim's
"GPU" holds (``KTD_SIM_GPU_EXPERTS_MAX``: the scheduler dies with torch's CUDA
out-of-memory error, as SGLang prints it) loads on the second try with fewer; status and
``ktctl doctor`` show the count kept; a restarted ktd launches with it at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktd.daemon.engine.gpuexperts import FILE
from tests.conftest import sim_model

pytestmark = pytest.mark.e2e

ALIAS = "kt-oom"


def entry(**more: Any) -> dict[str, Any]:
    return sim_model(
        ALIAS,
        env={"KTD_SIM_GPU_EXPERTS_MAX": "30", "KTD_SIM_CRASH_DIAG": "0"},
        kt={"extra_args": ["--kt-num-gpu-experts", "40"]},
        **more,
    )


def argv_count(engine: dict[str, Any]) -> str:
    argv = engine["argv"]
    return str(argv[argv.index("--kt-num-gpu-experts") + 1])


def test_a_derived_count_out_of_memory_loads_with_fewer_and_is_kept(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str]
) -> None:
    d = daemon_factory(write_config([entry(catalog="tiny-kt")]))
    r = d.ktctl("load", ALIAS, "--json")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()
    engine = d.engines()[ALIAS]
    assert engine["state"] == "ready" and argv_count(engine) == "30"
    assert engine["gpu_experts"] == 30
    log = (Path(ktd_env["KTD_STATE_DIR"]) / "logs" / f"{ALIAS}.log").read_text()
    assert "Scheduler hit an exception" in log and "torch.OutOfMemoryError: CUDA out of" in log
    assert "--kt-num-gpu-experts 40 (derived); retrying once with 30" in d.output()
    r = d.ktctl("status")
    assert f"note: {ALIAS}: --kt-num-gpu-experts 30 (kept on this host" in r.stdout, r.stdout
    r = d.ktctl("doctor")
    assert f"gpu experts {ALIAS}: --kt-num-gpu-experts 40 derived from the catalog" in r.stdout
    assert "30 kept on" in r.stdout, r.stdout
    r = d.ktctl("load", ALIAS, "--dry-run")  # the plan shows what the next launch runs
    assert r.returncode == 0 and "--kt-num-gpu-experts 30" in r.stdout, r.stdout
    state = json.loads((Path(ktd_env["KTD_STATE_DIR"]) / FILE).read_text())
    assert [m[ALIAS]["kept"] for m in state["hosts"].values()] == [30]  # this host's
    # A restarted ktd launches with the kept count at once: no out-of-memory load first.
    d.stop()
    d.start()
    before = d.output().count("retrying once with")
    assert d.ktctl("load", ALIAS).returncode == 0
    engine = d.engines()[ALIAS]
    assert argv_count(engine) == "30" and engine["gpu_experts"] == 30
    assert d.output().count("retrying once with") == before


def test_a_count_written_by_hand_is_never_retried(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str]
) -> None:
    d = daemon_factory(write_config([entry()]))  # no ``catalog``: the user's own count
    r = d.ktctl("load", ALIAS)
    assert r.returncode != 0 and "CUDA out of memory" in r.stderr, r.stderr
    engine = d.engines()[ALIAS]
    assert engine["state"] == "failed" and engine["gpu_experts"] is None
    log = (Path(ktd_env["KTD_STATE_DIR"]) / "logs" / f"{ALIAS}.log").read_text()
    starts = [ln for ln in log.splitlines() if ln.startswith("[ktd] starting:")]
    assert len(starts) == 1 and "--kt-num-gpu-experts 40" in starts[0], starts
    assert "retrying once with" not in d.output()
