"""Sleep on an SGLang without ``/pause_generation``, with a real daemon (issue 43, item 12).

Without a door the fence is zero load readings for ``REPUBLISH`` (2 s) on every sleep.
For a model that reloads faster than its sleep and wake take, ktd stops it instead of
putting it to sleep, in a swap as in ``ktctl sleep``, and says so in status and in the
sleep's answer; a model whose reload is slower still sleeps. The sims play an SGLang
without the door (``KTD_SIM_NO_DOOR``); the load durations ktd measured are seeded in its
load history (``load_history.json`` in the state dir, what the daemon reads at start),
so the comparison does not hang on how fast this box loads a sim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktctl import KtdError
from ktd.core.sleepcost import REPUBLISH
from tests.conftest import ConfigWriter, sim_model

NO_DOOR = {"KTD_SIM_NO_DOOR": 1}


def sleepy(alias: str) -> dict[str, Any]:
    """A sleep-enabled sim on NUMA node 0 (this box has one: one of them is awake)."""
    return sim_model(alias, numa=[0], sleep=True, env=NO_DOOR)


def test_a_model_that_reloads_faster_than_a_doorless_sleep_is_stopped_instead(
    write_config: ConfigWriter, daemon_factory: Any, ktd_env: dict[str, str]
) -> None:
    state = Path(ktd_env["KTD_STATE_DIR"])
    state.mkdir(mode=0o700, parents=True)
    quick, slow = 0.5, 60.0  # seconds: under the fence's REPUBLISH alone, and far over
    assert quick < REPUBLISH < slow
    loads = {"quick-kt": [quick] * 4, "slow-kt": [slow] * 4}
    (state / "load_history.json").write_text(json.dumps({"version": 1, "loads": loads}))
    d = daemon_factory(write_config([sleepy("quick-kt"), sleepy("slow-kt")]))
    with d.client(timeout=60) as c:
        first = c.load("quick-kt")
        assert first.sleep == "on"
        c.load("slow-kt")  # a swap: quick-kt makes room, stopped rather than asleep
        [e] = c.status("quick-kt")
        assert e.state == "stopped" and e.pid is None
        reason = e.reason or ""
        assert reason.startswith("stopped instead of sleeping: this SGLang has no ")
        assert "/pause_generation" in reason and f"{quick:.1f}s for a reload" in reason
        # The slow one sleeps, fenced by its load count alone.
        asleep = c.sleep("slow-kt")
        assert asleep.state == "asleep"
        assert any("fenced by its load count alone" in ln for ln in c.logs("slow-kt", 200))
        # ``ktctl sleep`` of the quick one: its answer says why it stopped instead.
        c.load("quick-kt")
        with pytest.raises(KtdError) as info:
            c.sleep("quick-kt")
        assert info.value.code == "load_failed"
        assert "sleep of quick-kt ended: stopped instead of sleeping" in info.value.message
    e = d.wait_state("quick-kt", "stopped")  # answered as it stops
    assert "no /pause_generation" in (e["reason"] or "")
