"""One doctor verdict (``Check``): the type every doctor shares, apart from any of them.

The machine's checks (``ktd.core.machinecheck``), the models' and the interpreter's
(``ktd.core.doctor``), the gateway's (``ktd.gateway.doctor``) and the GPU-experts
keeper's each return ``Check``s, and ``ktd.core.doctor.report`` counts them. The type
sits below all of them so that doctor can gather the families without a family
importing doctor back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "Status"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One verdict. ``advice`` says what to do about a warn/fail, in one line."""

    name: str
    status: Status
    detail: str
    advice: str = ""
