"""Silent clients cannot starve the frontend: a raised descriptor limit and a short idle timeout.

A real ``ktd frontend`` process (its own RLIMIT_NOFILE and Hypercorn config are
what is under test). Many connections that never send a byte are opened; a
request on a fresh connection is still answered, and the silent ones are
closed by the server once ``frontend.idle_timeout`` passes (waited for, with a
generous bound, not measured). The same holds after an answer the frontend makes
without an engine (Quart's routes: ``ktd/frontend/afterlife.py`` says why they
did not close), as do ``Connection: close`` and HTTP/1.0, and idle keep-alive
connections do not hold a SIGTERM.
"""

from __future__ import annotations

import json
import resource
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import sim_model

IDLE = 300


def _soft_nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            parts = line.split()
            return int(parts[3]), int(parts[4])
    raise AssertionError("no Max open files line")


def test_many_idle_connections_do_not_block_a_request(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    cfg = write_config([sim_model("m1")], frontend={"idle_timeout": 1})
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    soft, hard = _soft_nofile(fe.proc.pid)
    assert soft == hard  # raised from whatever it inherited
    want = min(IDLE, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64)
    host, port = fe.url.removeprefix("http://").split(":")
    idle: list[socket.socket] = []
    try:
        for _ in range(want):
            s = socket.create_connection((host, int(port)), timeout=10)
            idle.append(s)
        with httpx.Client(base_url=fe.url, timeout=30) as c:
            resp = c.post(
                "/v1/chat/completions",
                json={"model": "m1", "messages": [], "max_tokens": 1},
            )
            assert resp.status_code == 200, resp.text
        # The silent ones are closed by the server (EOF), none left hanging open.
        deadline = time.monotonic() + 60
        for s in idle:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1) == b""
    finally:
        for s in idle:
            s.close()


def test_frontend_raises_its_soft_descriptor_limit_to_the_hard_one() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import json, resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from ktd.frontend.main import raise_nofile_limit\n"
        "print(json.dumps([raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    reported, now = json.loads(out.stdout)
    assert reported == now and now[0] == now[1], out.stdout


# Answers the frontend makes itself outside the proxy: Quart's routes (health, models,
# metrics, worker info, its 404/405) and, once there, the Ollama answers of ollama.py.
SELF_ANSWERED = [
    ("GET", "/health", 200),
    ("GET", "/v1/models", 200),
    ("GET", "/v1/models/m1", 200),
    ("GET", "/metrics", 200),
    ("GET", "/server_info", 200),
    ("GET", "/nope", 404),
    ("POST", "/health", 405),
    ("GET", "/api/tags", 200),
    ("GET", "/api/version", 200),
    ("GET", "/api/pull", 405),
]


def _request(method: str, path: str, version: str = "1.1", extra: str = "") -> bytes:
    length = "content-length: 0\r\n" if method == "POST" else ""
    return f"{method} {path} HTTP/{version}\r\nhost: localhost\r\n{length}{extra}\r\n".encode()


def _read_response(s: socket.socket) -> tuple[int, bytes]:
    """One response (Content-Length framing); the socket is left right after its body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before a response: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(v)
        for k, _, v in (ln.partition(":") for ln in lines[1:])
        if k.lower() == "content-length"
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    assert len(rest) == length, "bytes after the response"
    return int(lines[0].split()[1]), head


def _closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_self_answered_routes_honour_close_http10_and_the_idle_timeout(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    """Raw sockets, each case on each route the frontend answers without an engine."""
    cfg = write_config([sim_model("m1")], frontend={"idle_timeout": 1})
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    idle: list[tuple[str, socket.socket]] = []
    try:
        for method, path, status in SELF_ANSWERED:
            for version, extra in (("1.1", "connection: close\r\n"), ("1.0", "")):
                with _connect(fe.url) as s:
                    s.sendall(_request(method, path, version, extra))
                    assert _read_response(s)[0] == status, (method, path)
                    assert _closed_by_server(s, 20), f"{method} {path} HTTP/{version} {extra!r}"
            s = _connect(fe.url)
            idle.append((f"{method} {path}", s))
            for _ in range(2):  # keep-alive works: a second request on the same connection
                s.sendall(_request(method, path))
                assert _read_response(s)[0] == status, (method, path)
        # Silent from now on: each is closed once frontend.idle_timeout (1 s) has passed.
        for what, s in idle:
            assert _closed_by_server(s, 30), f"{what}: still open past the idle timeout"
    finally:
        for _, s in idle:
            s.close()


def test_sigterm_with_idle_keep_alive_connections_exits_at_once(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    """Idle keep-alive connections (ktd's own health probe leaves one) must not hold a
    SIGTERM for the graceful timeout (5 s by default): Hypercorn closes idle ones at once."""
    cfg = write_config([sim_model("m1")])
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    conns = []
    try:
        for method, path, status in SELF_ANSWERED:
            s = _connect(fe.url)
            conns.append(s)
            s.sendall(_request(method, path))
            assert _read_response(s)[0] == status, (method, path)
        with httpx.Client(base_url=fe.url, timeout=30) as c:  # a proxied route's too
            chat = {"model": "m1", "messages": [], "max_tokens": 1}
            assert c.post("/v1/chat/completions", json=chat).status_code == 200
            t0 = time.monotonic()
            fe.proc.send_signal(signal.SIGTERM)
            assert fe.proc.wait(30) == 0, fe.output()
            took = time.monotonic() - t0
    finally:
        for s in conns:
            s.close()
    print(f"\nSIGTERM with {len(conns)} idle keep-alive connections: exit after {took:.3f}s")
    assert took < 3.0, f"SIGTERM took {took:.2f}s with idle connections (graceful timeout 5 s)"


def _stream_request(tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "m1",
            "stream": True,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )


def _read_stream(s: socket.socket, buf: bytes = b"") -> bytes:
    """A chunked SSE answer (``buf``: what was read of it) up to its terminating chunk
    (nothing after it is read)."""
    while not buf.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
        chunk = s.recv(65536)
        assert chunk, f"closed mid-stream after {buf[-200:]!r}"
        buf += chunk
    assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
    return buf


def _gate(port: int, open_: bool) -> None:
    """The sim's gate (``KTD_SIM_HOLD``) on the engine's ``port``: open lets the held
    streams go on, closed holds the next ones after their first token."""
    r = httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": open_}, timeout=30)
    r.raise_for_status()


def test_a_stream_outlasting_the_idle_timeout_and_a_sigterm_mid_stream(
    write_config: Any, daemon_factory: Any, frontend_factory: Any
) -> None:
    """The keep-alive timer (ktd/frontend/intake.py) counts idle time only: a stream that
    runs past ``idle_timeout`` is not cut and its connection stays usable; once silent it
    is closed. A SIGTERM while a stream runs lets it finish, then closes its connection.
    Each stream is held by the sim after its first token until the test opens its gate."""
    cfg = write_config([sim_model("m1", env={"KTD_SIM_HOLD": 1})], frontend={"idle_timeout": 1})
    d = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    with httpx.Client(base_url=fe.url, timeout=30) as c:  # loaded: the engine's port known
        chat = {"model": "m1", "messages": [], "max_tokens": 1}
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
    port = d.engines()["m1"]["port"]
    with _connect(fe.url) as s:
        s.settimeout(30)
        for _ in range(2):
            s.sendall(_stream_request(12))
            begun = s.recv(65536)  # the stream has begun, and is held
            time.sleep(1.5)  # longer than the idle timeout: the point of the test
            _gate(port, True)
            assert _read_stream(s, begun).count(b"data: ") >= 13
            _gate(port, False)
        assert _closed_by_server(s, 30), "still open past the idle timeout"
    with _connect(fe.url) as s:
        s.settimeout(30)
        s.sendall(_stream_request(12))
        begun = s.recv(65536)  # the stream has begun, and is held
        fe.proc.send_signal(signal.SIGTERM)
        _gate(port, True)
        assert _read_stream(s, begun).count(b"data: ") >= 13
        assert _closed_by_server(s, 30), "a connection outlived the shutdown"
    assert fe.proc.wait(30) == 0, fe.output()
