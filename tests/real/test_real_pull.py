"""Issue 44 in the real tier: ``ktctl pull --repo`` through a real ``ktd serve`` fetches the
tiny model from the hub stand-in (``tests/hub/standin.py``, ``HF_ENDPOINT`` pointed at
it, the real ``huggingface_hub`` in ktd's worker), and the REAL SGLang server loads the
pulled directory (``<catalog.dir>/<org>--<name>/<revision>/``, a models.json entry's
``path``) and answers a chat through ktd's frontend. A pull whose checksum did not match
is refused at the load, before any engine starts, with the file and both sums.

One daemon and one frontend for the module; one engine launch (the good pull's).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ktd.catalog import layout, verify
from tests.conftest import DaemonProc, wait_for
from tests.hub.standin import Repo, StandIn
from tests.real import engine_env
from tests.real.test_real_server import free_port

GOOD, BAD = "org/tiny", "org/tiny-bad"
CHAT = [{"role": "user", "content": "Say something."}]


@dataclass
class PullStack:
    daemon: DaemonProc
    hub: StandIn
    models: Path
    frontend_url: str
    root: Path

    def engines(self) -> dict[str, dict[str, Any]]:
        r = self.daemon.ktctl("status", "--json")
        assert r.returncode == 0, r.stderr
        return {e["alias"]: e for e in json.loads(r.stdout)["engines"]}

    def log(self, alias: str) -> str:
        path = self.root / "state" / "logs" / f"{alias}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def tiny_repo(name: str) -> Repo:
    """The real tier's tiny model (``make_model.py``), file for file; the safetensors is
    served as LFS (its sha256 in the metadata), the rest as files kept in git."""
    src = Path(engine_env.model_dir())
    return Repo(name, {f.name: f.read_bytes() for f in sorted(src.iterdir()) if f.is_file()})


@pytest.fixture(scope="module")
def stack(venv_python: Any, request: pytest.FixtureRequest) -> Iterator[PullStack]:
    failed_before = request.session.testsfailed
    root = Path(tempfile.mkdtemp(prefix="ktd-real-pull-", dir="/tmp"))
    models_dir = root / "models"
    hub = StandIn()
    hub.add(tiny_repo(GOOD))
    hub.add(tiny_repo(BAD))
    flags = {"extra_args": engine_env.ENGINE_FLAGS, "extra_env": engine_env.engine_env(base={})}
    models = [
        {
            "path": str(layout.dest_for(models_dir, repo, "main")),
            "backend": "kt",
            "alias": alias,
            "kt": flags,
        }
        for alias, repo in (("tiny", GOOD), ("bad", BAD))
    ]
    config, env = engine_env.ktd_config(
        root,
        venv_python(),
        models,
        {"stop_grace": 60, "drain_timeout": 30, "health_interval": 2},
        {"load_timeout": 600, "read_timeout": 300},
    )
    cfg = json.loads(Path(config).read_text())
    cfg["catalog"] = {"dir": str(models_dir)}
    Path(config).write_text(json.dumps(cfg))
    hub.start()
    env = {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf")}
    env.pop("HF_TOKEN", None)
    daemon = DaemonProc(config=Path(config), env=env, log_path=root / "ktd.log").start()
    port = free_port()
    with open(root / "frontend.log", "ab") as fe_log:
        frontend = subprocess.Popen(
            [sys.executable, "-m", "ktd", "frontend", "--config", config,
             "--bind", f"127.0.0.1:{port}"],
            env=env, stdout=fe_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), timeout=30, what="the frontend")
        yield PullStack(daemon, hub, models_dir, url, root)
    finally:
        frontend.send_signal(signal.SIGTERM)
        frontend.wait(30)
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop(timeout=120)
        hub.stop()
        if request.session.testsfailed == failed_before:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nthe real pull stack's logs are kept in {root}")


def _up(url: str) -> bool:
    try:
        httpx.get(url + "/metrics", timeout=2)
    except httpx.HTTPError:
        return False
    return True


def test_a_pull_whose_checksum_did_not_match_is_refused_at_the_load(stack: PullStack) -> None:
    """The stand-in's metadata names another sha256 for the weights: the pull fails
    ``checksum``, the files stay, and ``ktctl load`` refuses the directory before any
    engine starts, naming the file and both sums."""
    stack.hub.wrong_sha = {"model.safetensors"}
    try:
        r = stack.daemon.ktctl("pull", "--repo", BAD, "--json", timeout=120)
    finally:
        stack.hub.wrong_sha = set()
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 1 and lines[-1]["state"] == "failed", r.stdout + r.stderr
    assert lines[-1]["kind"] == "checksum", lines[-1]
    dest = layout.dest_for(stack.models, BAD, "main")
    assert (dest / "model.safetensors").is_file()
    ok, problems = verify.verified(dest)
    assert not ok and any("sha256" in x for x in problems), problems
    t0 = time.monotonic()
    r = stack.daemon.ktctl("load", "bad", "--timeout", "120", timeout=180)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert "is not verified" in r.stderr and "model.safetensors: sha256" in r.stderr, r.stderr
    assert str(dest) in r.stderr, r.stderr
    bad = stack.engines().get("bad", {})
    assert not bad.get("pid"), bad  # refused by the preflight: no SGLang was started
    assert "launch_server" not in stack.log("bad")
    print(f"\nreal tier: a wrong-checksum pull refused at the load in {took:.1f}s:\n{r.stderr}")


def test_the_pulled_tiny_model_loads_on_the_real_server_and_answers(stack: PullStack) -> None:
    """``ktctl pull --repo org/tiny`` to its end (every checksum matching), then the real
    SGLang server loads the pulled directory and answers a chat through the frontend."""
    before = stack.hub.sent["model.safetensors"]  # the stand-in counts by file name
    t0 = time.monotonic()
    r = stack.daemon.ktctl("pull", "--repo", GOOD, "--json", timeout=120)
    pulled = time.monotonic() - t0
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0 and lines[-1]["state"] == "done", r.stdout + r.stderr
    dest = layout.dest_for(stack.models, GOOD, "main")
    assert lines[-1]["dest"] == str(dest) and verify.verified(dest) == (True, [])
    src = Path(engine_env.model_dir())
    for f in src.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes(), f.name
    assert (
        stack.hub.sent["model.safetensors"] - before == (src / "model.safetensors").stat().st_size
    )
    t1 = time.monotonic()
    r = stack.daemon.ktctl("load", "tiny", "--timeout", "600", timeout=660)
    loaded = time.monotonic() - t1
    assert r.returncode == 0, r.stdout + r.stderr + stack.log("tiny")[-3000:]
    e = stack.engines()["tiny"]
    assert e["state"] == "ready" and e["pid"]
    assert e["argv"][e["argv"].index("--model") + 1] == str(dest)
    client = openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="none", timeout=300)
    t2 = time.monotonic()
    chat = client.chat.completions.create(
        model="tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=8,
    )
    answered = time.monotonic() - t2
    assert chat.choices[0].message.content, chat
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    print(
        f"\nreal tier: pulled {GOOD} in {pulled:.1f}s, loaded on the real server in"
        f" {loaded:.1f}s, a chat answered in {answered:.1f}s: {chat.choices[0].message.content!r}"
    )
