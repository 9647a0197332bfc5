"""The control contract both clients share: socket path, DEALER options, error replies."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from ktctl.client import KtdError
from ktd import protocol as p
from ktd.control.endpoint import check_reply, control_path, dealer
from ktd.control.errors import ControlError


def test_control_path_argument_then_env() -> None:
    env = {"KTD_SOCKET": "ipc:///tmp/env.sock"}
    assert control_path(None, env) == Path("/tmp/env.sock")
    assert control_path("ipc:///tmp/arg.sock", env) == Path("/tmp/arg.sock")
    assert control_path(None, {"KTD_RUNTIME_DIR": "/tmp/rt"}) == Path("/tmp/rt/control.sock")


def test_dealer_has_the_shared_options() -> None:
    ctx = zmq.Context()
    try:
        sock = dealer(ctx)
        assert sock.type == zmq.DEALER
        assert sock.getsockopt(zmq.LINGER) == 0
        assert sock.getsockopt(zmq.IMMEDIATE) == 1
        assert sock.getsockopt(zmq.RECONNECT_IVL_MAX) == 1000
        sock.close()
    finally:
        ctx.term()


def test_error_reply_raises_the_client_s_own_error() -> None:
    ok = p.Pong(id=1, version="x", pid=1)
    assert check_reply(ok, ControlError) is ok
    err = p.Error(id=1, code=p.ErrorCode.BUSY, message="held", detail={"holders": ["a"]})
    with pytest.raises(KtdError) as info:
        check_reply(err, KtdError)
    assert info.value.code == "busy" and info.value.detail == {"holders": ["a"]}
