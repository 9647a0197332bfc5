"""The first minutes with ktd (issue 13): ``ktd init``, ``ktd up`` messages, doctor with no
config and on the demo config. Through the real commands."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ktd.core.configload import load_config
from ktd.up import _banner, demo_config


def ktd(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ktd", *args],
        env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def ktctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ktctl", *args],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(
    tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    target = tmp_path / "etc" / "config.json"
    r = ktd("init", "--config", str(target), env=ktd_env)
    assert r.returncode == 0, r.stderr
    cfg = load_config(target)  # validates: unknown fields would be rejected
    assert [m.alias for m in cfg.served()] == ["deepseek-v3-kt"]
    readme = (target.parent / "config.README.txt").read_text()
    assert "kt_weight_path" in readme and "ktctl doctor" in readme
    before = target.read_bytes()
    again = ktd("init", "--config", str(target), env=ktd_env)
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr
    assert target.read_bytes() == before


def test_up_without_config_points_to_demo_and_init(tmp_path: Path, ktd_env: dict[str, str]) -> None:
    missing = tmp_path / "nowhere" / "config.json"
    r = ktd("up", "--config", str(missing), env=ktd_env)
    assert r.returncode == 2
    assert "no config at" in r.stderr and "ktd up --demo" in r.stderr and "ktd init" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["serve", "frontend"])
def test_serve_without_config_points_to_init_and_demo(
    tmp_path: Path, ktd_env: dict[str, str], command: str
) -> None:
    """Issue 43: ``ktd serve`` with no config said "cannot read" and nothing of
    ``ktd init``."""
    missing = tmp_path / "nowhere" / "config.json"
    r = ktd(command, env={**ktd_env, "KTD_CONFIG": str(missing)})
    assert r.returncode == 2
    assert f"no config at {missing}" in r.stderr
    assert f"ktd init --config {missing}" in r.stderr and "ktd up --demo" in r.stderr
    assert "Traceback" not in r.stderr


def test_up_busy_port_says_so_and_names_bind(tmp_path: Path, ktd_env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        root = Path("/tmp") / f"ktd-busy-{port}"
        r = ktd("up", "--demo", "--bind", f"127.0.0.1:{port}", "--dir", str(root), env=ktd_env)
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 1
    assert "already in use" in r.stderr and "--bind" in r.stderr
    assert "ktd is up" not in r.stdout  # no banner for a frontend that never bound


def test_banner_curl_carries_the_api_key_header() -> None:
    text = _banner("127.0.0.1:8000", Path("/run/ktd/control.sock"), False, None, api_keys=True)
    curls = [ln for ln in text.splitlines() if ln.strip().startswith("curl")]
    assert curls and all('-H "Authorization: Bearer $KTD_API_KEY"' in ln for ln in curls)
    assert "export KTD_API_KEY" in text
    assert "http://127.0.0.1:8000/ui?token=<key>" in text  # the dashboard; the key not printed
    plain = _banner("127.0.0.1:8000", Path("/s"), True, None)
    assert "Authorization" not in plain
    assert "http://127.0.0.1:8000/ui   (the dashboard" in plain


def test_the_banner_s_ktctl_runs_without_an_activated_venv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's command never activates the venv: a bare ``ktctl`` was "command not
    found". Off ``PATH``, the banner names the one beside the running interpreter."""
    monkeypatch.setenv("PATH", "/nonexistent")
    text = _banner("127.0.0.1:8000", Path("/s"), True, None)
    lines = [ln.strip() for ln in text.splitlines() if "--socket /s" in ln]
    assert lines and all(ln.startswith(str(Path(sys.executable).parent / "ktctl")) for ln in lines)
    ran = subprocess.run([*lines[0].split()[:1], "--help"], capture_output=True, text=True)
    assert ran.returncode == 0 and "status" in ran.stdout


def test_doctor_without_config_or_daemon_runs_machine_checks(
    tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    env = {**ktd_env, "KTD_CONFIG": str(tmp_path / "none" / "config.json")}
    r = ktctl("doctor", "--json", env=env)
    doc = json.loads(r.stdout)
    names = {c["name"] for c in doc["checks"]}
    assert {"cpu.isa", "cpu.cores", "numa.layout", "config"} <= names
    [cfg] = [c for c in doc["checks"] if c["name"] == "config"]
    assert cfg["status"] == "warn" and "ktd init" in cfg["advice"]


def test_doctor_on_the_demo_config_reports_no_model_failures(
    tmp_path: Path, ktd_env: dict[str, str]
) -> None:
    cfg = demo_config(tmp_path / "demo", "127.0.0.1:9")
    r = ktctl("doctor", "--json", "--config", str(cfg), env=ktd_env)
    doc = json.loads(r.stdout)
    model = [c for c in doc["checks"] if c["name"].startswith("ktd-sim.")]
    assert model and all(c["status"] == "ok" for c in model), model
