"""The pull worker (``python -m ktd.catalog.fetch``) against the hub stand-in: the real
huggingface_hub client end to end, one worker process per test (a few MB each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ktd.catalog import layout, verify
from tests.catalog.conftest import MiB
from tests.conftest import REPO
from tests.hub.standin import StandIn

pytestmark = pytest.mark.e2e


def worker_env(hub: StandIn, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url, HF_HOME=str(Path(os.environ.get("TMPDIR", "/tmp")) / "ktd-test-hf")
    )
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def argv(dest: Path, *more: str, repo: str = "org/tiny") -> list[str]:
    return [sys.executable, "-m", "ktd.catalog.fetch", "--repo", repo, "--revision", "main",
            "--dest", str(dest), *more]  # fmt: skip


def run(
    hub: StandIn, dest: Path, *more: str, repo: str = "org/tiny", **env: str
) -> tuple[int, list[dict[str, Any]]]:
    r = subprocess.run(
        argv(dest, *more, repo=repo), env=worker_env(hub, **env), capture_output=True, timeout=60
    )
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    return r.returncode, lines


def last(lines: list[dict[str, Any]]) -> dict[str, Any]:
    return lines[-1]


def test_a_pull_fetches_checks_and_marks_the_files(hub: StandIn, tmp_path: Path) -> None:
    dest = layout.dest_for(tmp_path, "org/tiny", "main")
    code, lines = run(hub, dest)
    assert code == 0, lines
    assert last(lines)["ev"] == "done"
    plan = lines[0]["plan"]
    assert (
        plan["to_fetch"]
        == plan["total"]
        == 4 * MiB + len(hub.repos["org/tiny"].files["config.json"])
    )
    assert (dest / "model.safetensors").read_bytes() == hub.repos["org/tiny"].files[
        "model.safetensors"
    ]
    assert verify.verified(dest) == (True, [])
    assert str(dest).endswith("org--tiny/main")
    # a second pull fetches nothing: every byte is here
    hub.sent.clear()
    code, lines = run(hub, dest)
    assert code == 0 and lines[0]["plan"]["to_fetch"] == 0 and not hub.sent


def test_a_killed_worker_resumes_by_range(hub: StandIn, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    hub.stall_after = 2 * MiB  # the body stops after 2 MiB: the worker is killed there
    proc = subprocess.Popen(argv(dest), env=worker_env(hub), stdout=subprocess.PIPE)
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    deadline = time.monotonic() + 30
    while not (partial.exists() and partial.stat().st_size >= 2 * MiB):
        assert time.monotonic() < deadline, "no 2 MiB partial file"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()  # type: ignore[union-attr]
    hub.release()
    kept = partial.stat().st_size
    code, lines = run(hub, dest)
    assert code == 0, lines
    assert any(ev["ev"] == "file" and ev.get("have") == kept for ev in lines)
    assert (
        "GET",
        f"/cdn/{hub.repos['org/tiny'].sha('model.safetensors')}",
        f"bytes={kept}-",
    ) in hub.requests
    twice = hub.sent["model.safetensors"] - 4 * MiB
    assert 0 <= twice <= 1 * MiB, f"{twice} bytes served twice"
    assert verify.verified(dest) == (True, [])


def test_gated_asks_for_a_token_and_honours_hf_token(hub: StandIn, tmp_path: Path) -> None:
    hub.gated_token = "hf_right"
    code, lines = run(hub, tmp_path / "m")
    assert code == 3 and last(lines)["kind"] == "gated" and "HF_TOKEN" in last(lines)["message"]
    code, lines = run(hub, tmp_path / "m", HF_TOKEN="hf_right")
    assert code == 0, lines


def test_a_missing_repo_is_said(hub: StandIn, tmp_path: Path) -> None:
    code, lines = run(hub, tmp_path / "m", repo="org/nothing")
    assert code == 3 and last(lines)["kind"] == "missing"


def test_a_failing_hub_is_a_server_error(hub: StandIn, tmp_path: Path) -> None:
    hub.fail_status = 500
    code, lines = run(hub, tmp_path / "m", HF_HUB_ETAG_TIMEOUT="1")
    assert code == 3 and last(lines)["kind"] == "server", lines


def test_a_wrong_checksum_is_flagged_and_fetched_again(hub: StandIn, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    hub.wrong_sha = {"model.safetensors"}
    code, lines = run(hub, dest)
    assert code == 3 and last(lines)["kind"] == "checksum"
    ok, problems = verify.verified(dest)
    assert not ok and problems[0].startswith("model.safetensors: sha256 ")
    assert (dest / "model.safetensors").exists()  # kept, flagged
    hub.wrong_sha = set()
    hub.sent.clear()
    code, lines = run(hub, dest)
    assert code == 0 and hub.sent["model.safetensors"] == 4 * MiB  # the flagged file again
    assert verify.verified(dest) == (True, [])


def test_verified_refuses_a_changed_or_unfinished_pull(hub: StandIn, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    assert not verify.verified(dest)[0]
    assert run(hub, dest)[0] == 0
    with (dest / "model.safetensors").open("ab") as f:
        f.write(b"x")
    ok, problems = verify.verified(dest)
    assert not ok and "model.safetensors" in problems[0]


def test_the_plan_counts_partial_bytes_and_refuses_a_short_disk(
    hub: StandIn, tmp_path: Path
) -> None:
    dest = tmp_path / "m"
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    partial.parent.mkdir(parents=True)
    partial.write_bytes(hub.repos["org/tiny"].files["model.safetensors"][:MiB])
    code, lines = run(hub, dest, "--plan")
    plan = lines[0]["plan"]
    assert code == 0 and plan["present"] == MiB and plan["to_fetch"] == plan["total"] - MiB
    assert not hub.sent


@pytest.fixture
def small_fs(tmp_path: Path) -> Any:
    """A 3 MiB tmpfs (root only): a real full disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_refused_before_a_byte_and_forced_keeps_what_it_got(
    hub: StandIn, small_fs: Path
) -> None:
    dest = small_fs / "m"
    code, lines = run(hub, dest)
    assert code == 3 and last(lines)["kind"] == "disk"
    assert "short" in last(lines)["message"] and "free" in last(lines)["message"]
    assert not hub.sent  # refused before the first byte
    code, lines = run(hub, dest, "--force")
    assert code == 3 and last(lines)["kind"] == "disk", lines
    assert "full" in last(lines)["message"]
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    assert partial.stat().st_size > MiB  # what was fetched is kept
