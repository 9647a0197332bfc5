"""One doctor verdict (``Check``): the type every doctor shares, apart from any of them;
and ``Verdicts``, the verdicts one named check can give.

The machine's checks (``ktd.core.machinecheck``), the models' and the interpreter's
(``ktd.core.doctor``), the gateway's (``ktd.gateway.doctor``) and the GPU-experts
keeper's each return ``Check``s, and ``ktd.core.doctor.report`` counts them. The type
sits below all of them so that doctor can gather the families without a family
importing doctor back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "Status", "Verdicts"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One verdict. ``advice`` says what to do about a warn/fail, in one line."""

    name: str
    status: Status
    detail: str
    advice: str = ""


@dataclass(frozen=True)
class Verdicts:
    """The verdicts one named check can give. A check names itself once
    (``v = Verdicts(f"{alias}.ctx")``) and each of its outcomes says only what differs
    (``v.fail(detail, advice)``), instead of repeating the name and the status's
    spelling in every return."""

    name: str

    def ok(self, detail: str) -> Check:
        return Check(self.name, "ok", detail)

    def warn(self, detail: str, advice: str) -> Check:
        return Check(self.name, "warn", detail, advice)

    def fail(self, detail: str, advice: str) -> Check:
        return Check(self.name, "fail", detail, advice)
