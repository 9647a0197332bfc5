"""Pulls as ktd's jobs, through a real daemon and ``ktctl``, against the hub stand-in:
a pull to its end, two asks sharing one job, a kill -9 of the daemon mid-pull and its
resume, a stall restarted, a cancel, the bound on jobs at once, the dry run."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ktd.catalog import layout, verify
from tests.catalog.conftest import MiB, tiny_repo
from tests.conftest import wait_for
from tests.hub.standin import StandIn

pytestmark = pytest.mark.e2e


def start(
    daemon_factory: Any,
    write_config: Any,
    ktd_env: dict[str, str],
    hub: StandIn,
    tmp_path: Path,
    **catalog: Any,
) -> Any:
    path = write_config([])
    cfg = json.loads(path.read_text())
    cfg["catalog"] = {"dir": str(tmp_path / "models"), "stall_timeout": 30, **catalog}
    path.write_text(json.dumps(cfg))
    env = {**ktd_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    return daemon_factory(path, env=env)


def jobs(d: Any) -> dict[str, dict[str, Any]]:
    r = d.ktctl("pulls", "--json")
    assert r.returncode == 0, r.stderr
    return {f"{j['repo']}@{j['revision']}": j for j in json.loads(r.stdout)["pulls"]}


def wait_job(d: Any, key: str, pred: Any, timeout: float = 30, what: str = "") -> dict[str, Any]:
    got: dict[str, Any] = {}

    def check() -> bool:
        got.update(jobs(d).get(key, {}))
        return bool(got) and pred(got)

    wait_for(check, timeout=timeout, what=what or f"pull {key}")
    return got


def test_a_pull_runs_to_its_end_with_progress_lines(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    r = d.ktctl("pull", "--repo", "org/tiny", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["state"] == "done" and lines[-1]["done"] == lines[-1]["total"] > 4 * MiB
    assert any(x["state"] == "running" and x["phase"] == "fetch" for x in lines)
    dest = layout.dest_for(tmp_path / "models", "org/tiny", "main")
    assert lines[-1]["dest"] == str(dest) and verify.verified(dest) == (True, [])
    assert jobs(d)["org/tiny@main"]["state"] == "done"
    # the plain text, without a terminal: a line per change and the end
    r = d.ktctl("pull", "--repo", "org/tiny")
    assert r.returncode == 0 and "done" in r.stdout.splitlines()[-1], r.stdout


def test_the_dry_run_prints_the_plan_and_fetches_nothing(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    r = d.ktctl("pull", "--repo", "org/tiny@main", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert (
        "model.safetensors" in r.stdout
        and "to fetch 4.0 MiB" in r.stdout
        and "fits: yes" in r.stdout
    )
    assert not hub.sent
    r = d.ktctl("pull", "--repo", "org/none", "--dry-run")
    assert r.returncode != 0 and "404" in r.stderr


def test_two_pulls_of_one_repo_share_one_job(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.rate = 8 * MiB  # half a second: the second ask finds the first running
    with d.client() as c:
        from ktd import protocol as p

        first = c.request(p.Pull(repo="org/tiny"))
        second = c.request(p.Pull(repo="org/tiny"))
    assert isinstance(first, p.PullReply) and isinstance(second, p.PullReply)
    assert not first.joined and second.joined
    wait_job(d, "org/tiny@main", lambda j: j["state"] == "done")
    assert hub.sent["model.safetensors"] == 4 * MiB  # fetched once


def worker_of(d: Any) -> int | None:
    """The pid of the daemon's pull worker (its child running ktd.catalog.fetch)."""
    pid = d.proc.pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ktd.catalog.fetch" in cmd and b"--plan" not in cmd:
                return int(child)
    return None


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_a_killed_worker_is_restarted_and_resumes(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.stall_after = 2 * MiB
    assert d.ktctl("pull", "--repo", "org/tiny", "--detach").returncode == 0
    dest = layout.dest_for(tmp_path / "models", "org/tiny", "main")
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    wait_for(
        lambda: partial.exists() and partial.stat().st_size >= 2 * MiB, timeout=30, what="2 MiB"
    )
    pid = worker_of(d)
    assert pid is not None
    # Killed while the hub holds the rest back: what it had written is all it got (bytes
    # the hub sent after a release but the worker never wrote would be fetched again,
    # and how many depends on the moment of the kill).
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), timeout=10, what="the worker gone")
    kept = partial.stat().st_size
    hub.release()
    job = wait_job(d, "org/tiny@main", lambda j: j["state"] in ("done", "failed"))
    assert job["state"] == "done" and job["restarts"] == 1, job
    cdn = "/cdn/" + hub.repos["org/tiny"].sha("model.safetensors")
    gets = [r for m, path, r in hub.requests if m == "GET" and path == cdn]
    assert gets[-1] == f"bytes={kept}-", (gets, kept)  # resumed where the file stood
    assert verify.verified(dest) == (True, [])


def test_a_killed_daemon_resumes_its_pull(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.stall_after = 2 * MiB
    r = d.ktctl("pull", "--repo", "org/tiny", "--detach")
    assert r.returncode == 0, r.stderr
    dest = layout.dest_for(tmp_path / "models", "org/tiny", "main")
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    wait_for(
        lambda: partial.exists() and partial.stat().st_size >= 2 * MiB,
        timeout=30,
        what="2 MiB fetched",
    )
    worker = worker_of(d)
    assert worker is not None
    d.stop(signal.SIGKILL)  # the worker dies with it (PR_SET_PDEATHSIG): its lock goes too
    wait_for(lambda: gone(worker), timeout=10, what="the worker gone with its daemon")
    kept = partial.stat().st_size
    hub.release()
    d.start()
    job = wait_job(d, "org/tiny@main", lambda j: j["state"] in ("done", "failed"))
    assert job["state"] == "done", job
    assert (
        "GET",
        f"/cdn/{hub.repos['org/tiny'].sha('model.safetensors')}",
        f"bytes={kept}-",
    ) in hub.requests
    assert hub.sent["model.safetensors"] - 4 * MiB <= MiB
    assert verify.verified(dest) == (True, [])


def test_a_stalled_pull_is_restarted_and_resumed(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path, stall_timeout=1)
    # One stall: the resumed request is served, however many looks the test's polls miss
    # (a stall at every resume would spend the job's restarts before a release came).
    hub.stall_after, hub.stall_once = 2 * MiB, True
    assert d.ktctl("pull", "--repo", "org/tiny", "--detach").returncode == 0
    job = wait_job(d, "org/tiny@main", lambda j: j["state"] in ("done", "failed"))
    assert job["state"] == "done" and job["restarts"] >= 1, job
    assert hub.sent["model.safetensors"] - 4 * MiB <= MiB


def test_a_stall_that_never_ends_fails_the_job(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path, stall_timeout=0.5)
    hub.stall_after = 0
    r = d.ktctl("pull", "--repo", "org/tiny", "--json", timeout=60)
    assert r.returncode == 1
    last = json.loads(r.stdout.splitlines()[-1])
    assert last["state"] == "failed" and last["kind"] == "stalled" and last["restarts"] == 3


def test_a_cancel_ends_the_job_and_keeps_its_bytes(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.stall_after = MiB
    assert d.ktctl("pull", "--repo", "org/tiny", "--detach").returncode == 0
    dest = layout.dest_for(tmp_path / "models", "org/tiny", "main")
    partial = layout.partial_path(dest, hub.repos["org/tiny"].sha("model.safetensors"))
    wait_for(lambda: partial.exists() and partial.stat().st_size >= MiB, timeout=30, what="1 MiB")
    r = d.ktctl("pull", "--cancel", "--repo", "org/tiny")
    assert r.returncode == 0, r.stderr
    job = wait_job(d, "org/tiny@main", lambda j: j["state"] != "running")
    assert job["state"] == "cancelled"
    assert partial.stat().st_size >= MiB
    assert not verify.verified(dest)[0]


def test_the_bound_on_jobs_at_once_queues_the_rest(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    hub.add(tiny_repo("org/other", MiB))
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path, max_pulls=1)
    hub.stall_after = MiB
    assert d.ktctl("pull", "--repo", "org/tiny", "--detach").returncode == 0
    wait_job(d, "org/tiny@main", lambda j: j["phase"] == "fetch" and j["done"] > 0)
    assert d.ktctl("pull", "--repo", "org/other", "--detach").returncode == 0
    assert jobs(d)["org/other@main"]["state"] == "queued"
    hub.release()
    wait_job(d, "org/other@main", lambda j: j["state"] == "done")
    assert jobs(d)["org/tiny@main"]["state"] == "done"


def test_a_gated_repo_fails_with_the_token_hint(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.gated_token = "hf_x"
    r = d.ktctl("pull", "--repo", "org/tiny")
    assert r.returncode == 1 and "gated" in r.stdout and "HF_TOKEN" in r.stdout, r.stdout


class Pty:
    """``ktctl`` on a real pseudo-terminal (its controlling terminal: Ctrl-C and the
    question on /dev/tty as a person gets them)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: ktctl, nothing else
            os.execve(argv[0], argv, env)
        self.out = b""

    def read_until(self, needle: bytes, timeout: float = 30) -> bytes:
        import select

        deadline = time.monotonic() + timeout
        while needle not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} on the terminal: {self.out[-2000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:  # the child is gone: EIO
                    break
        assert needle in self.out, f"no {needle!r} on the terminal: {self.out[-2000:]!r}"
        return self.out

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self) -> int:
        import contextlib

        with contextlib.suppress(AssertionError):
            self.read_until(b"\x00never", timeout=5)  # drain to EOF
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def test_on_a_terminal_a_bar_is_drawn_and_ctrl_c_asks_then_cancels(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    import sys

    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.rate = MiB  # four seconds: the bar is drawn while it runs
    term = Pty(
        [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "pull", "--repo", "org/tiny"],
        d.env,
    )
    out = term.read_until(b"ETA")
    term.read_until(b"/s ETA 00:0")  # a measured rate, an ETA in seconds
    assert b"org/tiny [#" in out or b"org/tiny [-" in out, out
    term.write(b"\x03")  # Ctrl-C, as the terminal sends it
    term.read_until(b"leave it running in ktd, or cancel it? [L/c]")
    term.write(b"c\n")
    term.read_until(b"cancelled")
    assert term.wait() == 130
    assert wait_job(d, "org/tiny@main", lambda j: j["state"] != "running")["state"] == "cancelled"


def test_ctrl_c_leaves_the_job_running_by_default(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    import sys

    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.rate = 2 * MiB
    term = Pty(
        [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "pull", "--repo", "org/tiny"],
        d.env,
    )
    term.read_until(b"ETA")
    term.write(b"\x03")
    term.read_until(b"[L/c]")
    term.write(b"\n")
    term.read_until(b"ktd goes on pulling org/tiny")
    assert term.wait() == 130
    assert wait_job(d, "org/tiny@main", lambda j: j["state"] != "running")["state"] == "done"


def test_a_flagged_pull_refuses_the_load_and_a_good_one_loads(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    from ktd.sim.model import SIM_CONFIG
    from tests.conftest import sim_model
    from tests.hub.standin import Repo

    files = {"config.json": json.dumps(SIM_CONFIG).encode(), "model.safetensors": os.urandom(MiB)}
    hub.add(Repo("org/sim", files))
    dest = layout.dest_for(tmp_path / "models", "org/sim", "main")
    path = write_config([sim_model("pulled", path=str(dest))])
    cfg = json.loads(path.read_text())
    cfg["catalog"] = {"dir": str(tmp_path / "models")}
    path.write_text(json.dumps(cfg))
    d = daemon_factory(
        path, env={**ktd_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    )
    hub.wrong_sha = {"model.safetensors"}
    r = d.ktctl("pull", "--repo", "org/sim")
    assert r.returncode == 1 and "checksum" in r.stdout, r.stdout
    r = d.ktctl("load", "pulled")
    assert r.returncode == 1 and "is not verified" in r.stderr and "sha256" in r.stderr, r.stderr
    hub.wrong_sha = set()
    assert d.ktctl("pull", "--repo", "org/sim").returncode == 0
    r = d.ktctl("load", "pulled")
    assert r.returncode == 0, r.stderr
    assert d.engines()["pulled"]["state"] == "ready"
