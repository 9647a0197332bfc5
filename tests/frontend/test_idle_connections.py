"""Silent clients cannot starve the frontend: a raised descriptor limit and a short idle timeout.

A real ``ktd frontend`` process (its own RLIMIT_NOFILE and Hypercorn config are
what is under test). Many connections that never send a byte are opened; a
request on a fresh connection is still answered, and the silent ones are
closed by the server once ``frontend.idle_timeout`` passes (waited for, with a
generous bound, not measured).
"""

from __future__ import annotations

import resource
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
