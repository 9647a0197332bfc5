"""One error type for the control API, on every side of the socket."""

from __future__ import annotations

import ktctl
from ktd import protocol as p
from ktd.control.errors import ControlError


def test_an_error_reply_round_trips() -> None:
    err = ControlError(p.ErrorCode.BUSY, "gpu 0 is held by a", {"holders": ["a"]})
    reply = err.to_reply()
    assert (reply.code, reply.message, reply.detail) == ("busy", "gpu 0 is held by a", err.detail)
    back = ControlError.from_reply(p.decode_reply(p.encode(reply)))  # type: ignore[arg-type]
    assert (back.code, back.message, back.detail) == (err.code, err.message, err.detail)
    assert str(back) == "busy: gpu 0 is held by a"


def test_ktctl_s_error_is_the_control_error() -> None:
    err = ktctl.KtdError.from_reply(p.Error(code="unknown_model", message="no x"))
    assert isinstance(err, ktctl.KtdError) and isinstance(err, ControlError)
    assert isinstance(err, ktctl.KtctlError)
    assert (err.code, err.message, err.detail) == ("unknown_model", "no x", {})
