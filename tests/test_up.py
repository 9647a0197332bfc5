"""``ktd up --demo``: both processes start, answer, and stop on SIGINT leaving nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ktd.up import DEMO_ALIAS, demo_config
from tests.frontend.frontend_helpers import free_port


def ktctl_without_a_socket(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``ktctl status`` as a user types it: no --socket, no KTD_SOCKET or KTD_RUNTIME_DIR."""
    bare = {k: v for k, v in env.items() if k not in ("KTD_SOCKET", "KTD_RUNTIME_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "ktctl", "status"],
        env=bare, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_demo_config_is_a_valid_config(tmp_path: Path) -> None:
    from ktd.core.configload import load_config

    cfg = load_config(demo_config(tmp_path, "127.0.0.1:9"))
    spec = cfg.route(DEMO_ALIAS)
    assert spec is not None and spec.backend == "kt"
    assert dict(spec.extra_env)["PYTHONPATH"].endswith("ktd/sim/shim")
    assert cfg.frontend.bind == "127.0.0.1:9"


def test_up_demo_serves_and_stops_cleanly(tmp_path: Path, ktd_env: dict[str, str]) -> None:
    port = free_port()
    root = Path("/tmp") / f"ktd-up-{port}"  # short: ipc socket paths are limited
    log = tmp_path / "up.log"
    # The user's own runtime dir, where ``ktd up`` says where it serves (issue 43).
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    ktd_env = {**ktd_env, "XDG_RUNTIME_DIR": str(xdg)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ktd", "up", "--demo"),
                *("--bind", f"127.0.0.1:{port}", "--dir", str(root)),
            ],
            env=ktd_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while b"ktd is up" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        # curl-equivalent: what the banner tells people to run.
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [DEMO_ALIAS]
        resp = httpx.post(
            url + "/v1/chat/completions",
            json={"model": DEMO_ALIAS, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"]
        text = log.read_text()
        assert "ktctl --socket" in text and "curl" in text
        # A bare ``ktctl status`` (no --socket, no KTD_*) finds the demo and says so.
        status = ktctl_without_a_socket(ktd_env)
        assert status.returncode == 0, status.stderr
        assert DEMO_ALIAS in status.stdout
        assert f"using the `ktd up` (pid {proc.pid}) at {root / 'run' / 'control.sock'}" in (
            status.stderr
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    assert code == 0, log.read_text()
    assert "ktd up: stopped" in log.read_text()
    assert not (xdg / "ktd-up.json").exists()  # its record goes with it
    gone = ktctl_without_a_socket(ktd_env)
    assert gone.returncode == 3 and "ktd up --demo" in gone.stderr
    # The autouse leak check then verifies no daemon, frontend or engine survived.


def test_the_banner_asks_for_a_key_when_named_keys_are_set(tmp_path: Path) -> None:
    """Regression: only ``frontend.api_keys`` made the banner say how to send a key;
    ``frontend.keys`` (named keys) left it out, and its curl line got a 401."""
    import argparse
    import json

    from ktd.up import Stack, _banner, _setup

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": {"keys": [{"name": "ops", "key": "sk-1"}]}}))
    args = argparse.Namespace(demo=False, config=str(config), bind=None, dir=None)
    setup = _setup(args, {})
    assert isinstance(setup, Stack) and setup.keys and setup.bind == "127.0.0.1:8000"
    text = _banner(setup.bind, tmp_path / "control.sock", False, None, api_keys=setup.keys)
    assert "Authorization: Bearer $KTD_API_KEY" in text and "frontend.keys" in text
    assert _setup(argparse.Namespace(demo=False, config=str(tmp_path / "no.json")), {}) == 2
