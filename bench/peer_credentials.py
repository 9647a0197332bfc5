"""What reading each control request's sender costs the daemon's socket pump (issue 39).

The control socket records who changed the config: libzmq reads ``SO_PEERCRED`` of
each ipc connection and gives it as a message's ``Peer-Address`` property, which pyzmq
shows only on frames received without copying. This times the pump's receive both
ways on a real ipc ROUTER: ``recv_multipart()`` (as before) against
``recv_multipart(copy=False)`` + ``bytes`` + ``Peer-Address`` (``TrioSocket(peers=True)``),
alternated ``--rounds`` times, ``--messages`` 120-byte messages a round.

    python bench/peer_credentials.py [--rounds 6] [--messages 100000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import zmq


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--messages", type=int, default=100_000)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="ktd-peer-")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVHWM, 0)
    router.bind(f"ipc://{folder}/s")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(f"ipc://{folder}/s")
    payload = b"x" * 120
    n = args.messages

    def plain() -> float:
        for _ in range(n):
            dealer.send(payload)
        t0 = time.perf_counter()
        for _ in range(n):
            router.recv_multipart()
        return (time.perf_counter() - t0) / n * 1e6

    def with_peer() -> float:
        for _ in range(n):
            dealer.send(payload)
        t0 = time.perf_counter()
        for _ in range(n):
            parts = router.recv_multipart(copy=False)
            [f.bytes for f in parts]
            parts[-1].get("Peer-Address")
        return (time.perf_counter() - t0) / n * 1e6

    before, after = [], []
    for _ in range(args.rounds):
        before.append(plain())
        after.append(with_peer())
    b, a = statistics.median(before), statistics.median(after)
    print(f"recv_multipart()                       median {b:.2f} µs/message")
    print(f"recv_multipart(copy=False) + the peer  median {a:.2f} µs/message")
    print(f"added per message: {a - b:+.2f} µs")
    ctx.destroy(linger=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
