"""The frontend's engine series (``ktd.frontend.metrics``): every state; in flight under
both names."""

from __future__ import annotations

from ktd import protocol as p
from ktd.core import states as S
from ktd.frontend.metrics import ENGINE_STATES, EngineCollector, Metrics


def test_engine_state_gauge_has_every_state_sleep_included() -> None:
    """``ktd_engine_state{alias,state}``: one series per state of ktd.core.states, so an
    asleep engine reads 1 for ``asleep`` (and a dashboard can sum the sleepers)."""
    assert set(ENGINE_STATES) == set(S.ALL) >= {"sleeping", "asleep", "waking"}
    collector = EngineCollector()
    collector.snapshot = [
        p.EngineInfo(alias="m1", state="asleep"),
        p.EngineInfo(alias="m2", state="waking"),
    ]
    [family] = [f for f in collector.collect() if f.name == "ktd_engine_state"]
    on = {(s.labels["alias"], s.labels["state"]) for s in family.samples if s.value == 1.0}
    assert on == {("m1", "asleep"), ("m2", "waking")}
    assert len(family.samples) == 2 * len(S.ALL)


def test_engine_in_flight_is_rendered_under_its_name_and_its_deprecated_one() -> None:
    """``ktd_engine_leases`` stays one release, for the dashboards and alerts that read it."""
    metrics = Metrics()
    metrics.update_engines([p.EngineInfo(alias="m1", state=p.EngineState.READY, in_flight=3)])
    text = metrics.render()[0].decode()
    assert 'ktd_engine_in_flight{alias="m1"} 3.0' in text
    assert 'ktd_engine_leases{alias="m1"} 3.0' in text
    assert "# HELP ktd_engine_leases Deprecated: use ktd_engine_in_flight." in text
