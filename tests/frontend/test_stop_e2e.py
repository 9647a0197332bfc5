"""An evict with a stream in flight, through the real ``ktd serve`` and ``ktd frontend``,
when the engine's ``python`` is a wrapper script that does not ``exec`` (conda and
environment-module set-ups do this): SIGTERM must reach SGLang's own server process,
not the shell, so that SGLang drains the stream instead of being killed under it."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktd.core.command import ENGINE_MARK
from ktd.daemon.engine import proctree
from tests.conftest import marked_processes, sim_model, wait_for

TOKENS = 20


def read_stream(url: str, out: dict[str, Any], started: threading.Event) -> None:
    body = {
        "model": "w-kt",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "stream": True,
    }
    out.update(tokens=0, done=False, error=None)
    try:
        with (
            httpx.Client(base_url=url, timeout=120) as c,
            c.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        out["error"] = event
                    elif event["choices"] and event["choices"][0]["delta"].get("content"):
                        out["tokens"] += 1
                        started.set()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    finally:
        started.set()


def open_gate_on_sigterm(d: Any, port: int) -> None:
    """Once the server logged its SIGTERM, let the held stream go on (the sim's gate)."""
    with d.client(timeout=60) as c:
        wait_for(
            lambda: "SIGTERM received" in "\n".join(c.logs("w-kt", 300)),
            timeout=60,
            what="the server's SIGTERM",
        )
    r = httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}, timeout=30)
    r.raise_for_status()


@pytest.mark.parametrize(("flavor", "code"), [("upstream", 0), ("kt", 128 + 9)])
def test_a_wrapper_interpreter_lets_sglang_drain_a_live_stream_on_evict(
    write_config: Any,
    daemon_factory: Any,
    frontend_factory: Any,
    tmp_path: Path,
    flavor: str,
    code: int,
) -> None:
    """``kt.python`` is a shell script that runs the real interpreter as its child. A
    non-forced evict whose drain bound (``--timeout``) ends while a stream is running:
    ktd sends SIGTERM to SGLang's server process under the shell, SGLang drains, the
    stream ends with all its tokens and ``[DONE]``, and ktd SIGKILLs nothing. (The
    kt fork SIGKILLs its own tree after its drain: the shell reports 128+9.)"""
    wrapper = tmp_path / "py-wrapper"
    # Sets up an environment, then runs the interpreter as its child (no exec).
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    # The stream is held after its first token (``KTD_SIM_HOLD``) until SGLang's server
    # has its SIGTERM: it runs past the 0.5 s drain bound however slow the box.
    env = {"KTD_SIM_HOLD": 1, "KTD_SIM_DRAIN": 60, "KTD_SIM_SGLANG": flavor}
    model = sim_model("w-kt", env=env, kt={"python": str(wrapper)})
    cfg = write_config([model], daemon={"stop_grace": 60, "drain_timeout": 60})
    d = daemon_factory(cfg)
    fe = frontend_factory(cfg)
    out: dict[str, Any] = {}
    started = threading.Event()
    reader = threading.Thread(target=read_stream, args=(fe.url, out, started), daemon=True)
    reader.start()
    assert started.wait(60) and out["error"] is None, out
    with d.client(timeout=120) as c:
        [e] = c.status("w-kt")
        shell = proctree.cmdline(e.pid)
        assert shell[:2] == ["/bin/sh", str(wrapper)], shell  # the main process is the shell
        gate = threading.Thread(target=open_gate_on_sigterm, args=(d, e.port), daemon=True)
        gate.start()
        t0 = time.monotonic()
        assert c.evict("w-kt", timeout=0.5) == ["w-kt"]  # the drain bound ends mid-stream
        took = time.monotonic() - t0
        gate.join(60)
        log = "\n".join(c.logs("w-kt", 300))
    reader.join(60)
    assert not reader.is_alive()
    assert out["status"] == 200 and out["error"] is None, out
    assert out["tokens"] == TOKENS and out["done"], out
    assert "drain ended with 1 request(s) still running" in log  # SIGTERM came mid-stream
    assert "SIGTERM received" in log, log  # the server's own drain, not the shell's death
    assert "SIGKILL to" not in log, log
    assert took < 15, took
    assert "SIGTERM to SGLang's server process" in log
    # The shell exits by itself once its child has; if ktd's look comes first, the shell
    # is one of "the processes left" and gets their SIGTERM (-15). Both are clean.
    assert any(f"stopped cleanly by SIGTERM (pid {e.pid}, exit {c})" in log for c in (code, -15)), (
        log
    )
    wait_for(
        lambda: not any(proctree.environ_has(p, ENGINE_MARK) for p, _ in marked_processes()),
        what="no engine process",
    )
