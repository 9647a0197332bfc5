"""The gateway's doctor checks (``ktd.gateway.doctor``)."""

from __future__ import annotations

from ktd.gateway import doctor
from ktd.gateway.plan import OWNER_LABEL


def test_doctor_checks() -> None:
    from ktd.core.config import GatewaySection
    from ktd.gateway.plan import Listed

    cfg = GatewaySection(routers=["http://10.0.0.1:30000"])
    ours = Listed(id="1", url="http://127.0.0.1:5", labels={OWNER_LABEL: "me"})
    got = doctor.checks(
        cfg,
        [doctor.RouterProbe("http://10.0.0.1:30000", [ours]), doctor.RouterProbe("x", error="no")],
        instance="me",
        wanted=["http://127.0.0.1:5", "http://127.0.0.1:6"],
        advertised_hosts=["127.0.0.1"],
    )
    assert [(c.name, c.status) for c in got] == [
        ("gateway.http://10.0.0.1:30000", "warn"),
        ("gateway.x", "fail"),
        ("gateway.advertise", "warn"),
    ]
    assert "http://127.0.0.1:6" in got[0].detail
    assert doctor.checks(GatewaySection(), [], instance=None) == []
