"""The one-task-per-socket pump under load: nothing lost, no stall on the edge-triggered FD."""

from __future__ import annotations

import threading
from pathlib import Path

import trio
import zmq

from ktd import protocol as p
from ktd.control.aclient import AsyncClient, Unreachable
from ktd.control.errors import ControlError
from ktd.control.zmqtrio import TrioSocket


async def test_router_echo_many_concurrent_requests(tmp_path: Path) -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/r.sock"
    router.bind(endpoint)
    server: TrioSocket

    def on_message(frames: list[bytes]) -> None:
        req = p.decode_request(frames[-1])
        if isinstance(req, p.Load):
            reply: p.Reply = p.Error(id=req.id, code="busy", message=req.alias)
        else:
            reply = p.Pong(id=req.id, version="t", pid=1)
        server.send([*frames[:-1], p.encode(reply)])

    server = TrioSocket(router, on_message)
    client = AsyncClient(endpoint, timeout=10)
    results: list[int] = []
    async with trio.open_nursery() as n:
        n.start_soon(server.run)
        await n.start(client.run)

        async def one(i: int) -> None:
            reply = await client.request(p.Ping())
            assert isinstance(reply, p.Pong)
            results.append(i)

        async with trio.open_nursery() as inner:
            for i in range(500):
                inner.start_soon(one, i)
        try:
            await client.request(p.Load(alias="x"))
        except ControlError as exc:
            assert exc.code == "busy" and exc.message == "x"
        n.cancel_scope.cancel()
    server.close()
    assert sorted(results) == list(range(500))


async def test_external_sync_clients_and_bursts(tmp_path: Path) -> None:
    """Bursts from threads (sync DEALERs) while the trio side idles: the FD edge is not lost."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/r.sock"
    router.bind(endpoint)
    got = []
    server: TrioSocket

    def on_message(frames: list[bytes]) -> None:
        got.append(frames[-1])
        server.send([frames[0], frames[-1]])

    server = TrioSocket(router, on_message)
    answered = []

    def client(k: int) -> None:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        for i in range(100):
            s.send(f"{k}-{i}".encode())
        for _ in range(100):
            if s.poll(5000):
                answered.append(s.recv())
        s.close()

    async with trio.open_nursery() as n:
        n.start_soon(server.run)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        with trio.fail_after(20):
            while len(answered) < 800:
                await trio.sleep(0.01)
        for t in threads:
            t.join()
        n.cancel_scope.cancel()
    server.close()
    assert len(got) == 800 and len(answered) == 800


async def test_unreachable_times_out(tmp_path: Path) -> None:
    client = AsyncClient(f"ipc://{tmp_path}/nobody.sock", timeout=0.2)
    async with trio.open_nursery() as n:
        await n.start(client.run)
        try:
            await client.request(p.Ping())
        except Unreachable as exc:
            assert "nobody.sock" in str(exc)
        else:
            raise AssertionError("expected Unreachable")
        n.cancel_scope.cancel()


async def test_a_frame_over_the_limit_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    # Nobody listens: were it sent, the caller would wait out its timeout.
    client = AsyncClient(f"ipc://{tmp_path}/none.sock", timeout=30)
    async with trio.open_nursery() as n:
        await n.start(client.run)
        with trio.fail_after(5):
            try:
                await client.request(p.Status(alias="x" * (p.MAX_FRAME + 1)))
            except ControlError as exc:
                assert exc.code == p.ErrorCode.BAD_REQUEST and "exceeds" in exc.message
            else:
                raise AssertionError("sent")
        n.cancel_scope.cancel()


async def test_undeliverable_messages_are_reported_not_lost_silently(tmp_path: Path) -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(f"ipc://{tmp_path}/r.sock")
    dropped: list[list[bytes]] = []
    sock = TrioSocket(router, lambda frames: None, on_drop=dropped.append)
    async with trio.open_nursery() as n:
        n.start_soon(sock.run)
        sock.send([b"no-such-peer", b"reply"])  # a client that went away
        with trio.fail_after(5):
            while not dropped:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    sock.close()
    assert dropped == [[b"no-such-peer", b"reply"]] and sock.dropped == 1


async def test_a_peer_that_does_not_read_loses_its_replies_and_holds_up_nobody(
    tmp_path: Path,
) -> None:
    """A per-peer high-water mark (``on_full``): past it, that peer's messages are
    dropped and reported, and the next peer's go out at once; without ``on_full`` the
    pump would wait on the full peer forever (its EAGAIN) and everyone behind it too."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 10)
    router.bind(f"ipc://{tmp_path}/r.sock")
    peers = {}
    for name, hwm in ((b"mute", 1), (b"reader", 1000)):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, hwm)
        s.setsockopt(zmq.IDENTITY, name)
        s.connect(f"ipc://{tmp_path}/r.sock")
        s.send(b"hello")
        peers[name] = s
    full: list[list[bytes]] = []
    hellos: list[list[bytes]] = []
    sock = TrioSocket(router, hellos.append, on_full=full.append)
    try:
        async with trio.open_nursery() as n:
            n.start_soon(sock.run)
            with trio.fail_after(5):
                while len(hellos) < 2:
                    await trio.sleep(0.01)
            for _ in range(5000):  # 5 MB the mute peer never reads
                sock.send([b"mute", b"x" * 1000])
            sock.send([b"reader", b"after"])
            with trio.fail_after(5):
                while not peers[b"reader"].poll(0):
                    await trio.sleep(0.01)
            assert peers[b"reader"].recv() == b"after"
            n.cancel_scope.cancel()
    finally:
        sock.close()
        for s in peers.values():
            s.close(0)
    assert full and all(f[0] == b"mute" for f in full) and sock.dropped == len(full)
    assert len(full) > 4000  # what fits in the kernel's buffers and the peer's queues went


def test_peer_credentials_are_read_from_libzmqs_peer_address() -> None:
    from ktd.control.zmqtrio import Peer, peer_of

    assert peer_of("localhost:1000:100:4242") == Peer(uid=1000, gid=100, pid=4242)
    assert peer_of(":0:0:7") == Peer(0, 0, 7)
    for odd in (None, "", "127.0.0.1", "a:b:c:d", "host:1:2"):
        assert peer_of(odd) is None


async def test_a_reply_nested_too_deeply_is_dropped_and_the_client_serves_on(
    tmp_path: Path,
) -> None:
    """Issue 43: a reply of 1,000 nested arrays raised RecursionError out of the client's
    pump (the frontend's line to ktd); it is dropped as any undecodable reply is (its
    caller waits out its timeout), and the next reply is read."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/r.sock"
    router.bind(endpoint)
    server: TrioSocket
    answered = 0

    def on_message(frames: list[bytes]) -> None:
        nonlocal answered
        answered += 1
        req = p.decode_request(frames[-1])
        reply = p.encode(p.Pong(id=req.id, version="t", pid=1))
        if answered == 1:  # {"type": "pong", ..., "pad": [[[...]]]}
            reply = bytes([reply[0] + 1]) + reply[1:] + b"\xa3pad" + b"\x91" * 1000 + b"\xc0"
        server.send([*frames[:-1], reply])

    server = TrioSocket(router, on_message)
    client = AsyncClient(endpoint, timeout=0.5)
    async with trio.open_nursery() as n:
        n.start_soon(server.run)
        await n.start(client.run)
        try:
            await client.request(p.Ping())
        except Unreachable:
            pass  # its reply could not be read: the caller's timeout
        else:
            raise AssertionError("a reply nested 1,000 deep was read")
        assert isinstance(await client.request(p.Ping()), p.Pong)
        n.cancel_scope.cancel()
    server.close()
