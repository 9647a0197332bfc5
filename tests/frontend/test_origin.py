"""Which browsers' requests the frontend answers (ktd.frontend.origin): the policy, pure,
and a real WebSocket handshake refused without a traceback."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from ktd.frontend.origin import OriginPolicy, is_json, is_loopback_bind
from tests.conftest import ConfigWriter, sim_model


def scope(method: str = "GET", path: str = "/v1/models", **headers: str) -> dict[str, Any]:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw}


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [
        ("127.0.0.1:8000", True),
        ("127.3.2.1:80", True),
        ("[::1]:8000", True),
        ("localhost:8000", True),
        ("0.0.0.0:8000", False),
        ("10.1.2.3:8000", False),
        ("unix:/run/ktd.sock", False),
    ],
)
def test_which_binds_check_the_host(bind: str, loopback: bool) -> None:
    assert is_loopback_bind(bind) is loopback


def test_hosts_on_a_loopback_bind() -> None:
    policy = OriginPolicy("127.0.0.1:8000", allowed_hosts=["ktd.lab"], hostname="box1")
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "a.localhost:8000", "box1:8000"):
        assert policy.host_ok(host), host
    assert policy.host_ok("ktd.lab:8000") and policy.host_ok(None)
    for host in ("evil.example", "evil.example:8000", "192.168.1.5:8000", "localhost.evil"):
        assert not policy.host_ok(host), host
    assert OriginPolicy("0.0.0.0:8000").host_ok("evil.example")  # bound elsewhere: any
    assert OriginPolicy("127.0.0.1:8000", allowed_hosts=["*"]).host_ok("evil.example")


def test_origins_its_own_and_the_allowed() -> None:
    policy = OriginPolicy("127.0.0.1:8000", allowed_origins=["https://app.lab"])
    assert policy.origin_ok(None, "127.0.0.1:8000")  # not a browser
    assert policy.origin_ok("http://127.0.0.1:8000", "127.0.0.1:8000")  # its own page
    assert policy.origin_ok("https://app.lab/", "127.0.0.1:8000")
    for origin in ("http://localhost:8000", "http://127.0.0.1:9999", "null", "https://evil"):
        assert not policy.origin_ok(origin, "127.0.0.1:8000"), origin
    assert OriginPolicy("127.0.0.1:8000", allowed_origins=["*"]).origin_ok("null", "x")


def test_refusals_are_typed_and_json_bodies_must_say_so() -> None:
    policy = OriginPolicy("127.0.0.1:8000", hostname="box1")
    assert policy.refusal(scope(host="localhost:8000")) is None
    bad = policy.refusal(scope(host="evil.example"))
    assert bad is not None and (bad.status, bad.code) == (403, "host_not_allowed")
    foreign = policy.refusal(scope(host="localhost:8000", origin="http://evil.example"))
    assert foreign is not None and foreign.code == "origin_not_allowed"
    plain = scope("POST", "/v1/chat/completions", host="localhost", content_type="text/plain")
    plain["headers"].append((b"content-length", b"10"))
    refused = policy.refusal(plain)
    assert refused is not None and (refused.status, refused.code) == (415, "unsupported_media_type")
    audio = scope("POST", "/v1/audio/transcriptions", host="localhost")
    audio["headers"] += [(b"content-type", b"multipart/form-data"), (b"content-length", b"9")]
    assert policy.refusal(audio) is None
    empty = scope("POST", "/v1/responses/r1/cancel", host="localhost")  # no body, no type
    assert policy.refusal(empty) is None
    assert is_json("application/json; charset=utf-8") and is_json("application/vnd.x+json")
    assert not is_json("text/plain") and not is_json(None) and not is_json("application/jsonp")


def test_a_websocket_upgrade_is_refused_quietly(
    write_config: ConfigWriter, daemon_factory: Any, frontend_factory: Any
) -> None:
    cfg = write_config([sim_model("m1")])
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    host, port = fe.url.removeprefix("http://").split(":")
    for path in ("/", "/v1/chat/completions", "/ui/api/events"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(
                (
                    f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
            )
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 403"), head
    assert "Traceback" not in fe.output() and "ERROR" not in fe.output()
