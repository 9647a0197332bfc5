"""A burst of acquires (the leases other local tools use) for a cold model loses no reply.

The daemon's ROUTER used to drop replies past its send high-water mark (1,000):
the leases in them were granted to nobody and pinned the engine for good.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from ktd import protocol as p
from tests.conftest import sim_model, wait_for

N = 3000


def test_every_acquire_of_a_burst_gets_its_reply(write_config: Any, daemon_factory: Any) -> None:
    daemon = daemon_factory(write_config([sim_model("m", env={"KTD_SIM_LOAD_TIME": 1})]))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # the default RCVHWM (1,000), as a busy client has
    sock.connect(f"ipc://{Path(daemon.socket)}")

    def held() -> int:
        return int(daemon.engines()["m"]["in_flight"])

    try:
        for i in range(1, N + 1):
            sock.send(p.encode(p.Acquire(id=i, model="m", client="burst", timeout=120)))
        # Not reading: every lease is granted while the replies pile up unread.
        wait_for(lambda: held() == N, timeout=60, what="all granted")
        leases: dict[int, str] = {}
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while len(leases) < N:
            assert poller.poll(60_000), f"{N - len(leases)} replies never came"
            reply = p.decode_reply(sock.recv())
            assert isinstance(reply, p.AcquireReply), reply
            leases[reply.id] = reply.lease
        for i, lease in leases.items():
            sock.send(p.encode(p.Release(id=i, lease=lease)))
        # Each release's own reply, read before the socket closes: a close with LINGER 0
        # drops what is still queued, and the leases would then end only by expiring
        # (lease_ttl, 15 s), which the count below cannot tell from a release.
        released = 0
        while released < N:
            assert poller.poll(60_000), f"{N - released} releases never answered"
            reply = p.decode_reply(sock.recv())
            assert isinstance(reply, p.Ok), reply
            released += 1
    finally:
        sock.close()
    assert held() == 0
