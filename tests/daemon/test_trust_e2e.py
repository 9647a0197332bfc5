"""The trust model (issue 43, docs/security.md), tested as the other party: ktctl's client
run as another uid (``setpriv``) against a real daemon's control socket with
``daemon.group`` set, and the dashboard's admin key against a real frontend.

The daemon runs as root (the test's uid): ktd's owner. ``ktdtrust-admin`` is in
``daemon.admins``; ``ktdtrust-member`` is only in ``daemon.group``. A script that
touches a file stands for a program a client must not get run: its file must not appear
(and for the owner, whose plan may run a new interpreter, it does: the probe ran it).

One daemon and one frontend for the module; each test starts from the module's files.
"""

from __future__ import annotations

import grp
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktctl.client import KtdError
from ktd.core import configtext
from tests.conftest import MARK, REPO, DaemonProc, own_env, sim_model
from tests.frontend.conftest import FrontendProc, launch_frontend

pytestmark = pytest.mark.e2e

GROUP, ADMIN, MEMBER = "ktdtrust", "ktdtrust-admin", "ktdtrust-member"
HF_SECRET, OPS_KEY, GATEWAY_SECRET = "hf_trust-secret-43", "sk-trust-ops-43", "gw-trust-secret-43"
SECRETS = (HF_SECRET, OPS_KEY, GATEWAY_SECRET)

# ktctl's client in another process, as whoever runs it: one call, its answer as JSON.
CALL = r"""
import json, sys
import msgspec
from ktctl.client import Client, KtdError
socket, method, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with Client(socket, timeout=60) as c:
        out = getattr(c, method)(**kwargs)
    print(json.dumps({"reply": msgspec.to_builtins(out)}))
except KtdError as e:
    print(json.dumps({"error": e.code, "message": e.message, "detail": e.detail}))
"""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def _ensure(cmd: list[str], exists: Any) -> None:
    """Run ``useradd``/``groupadd`` unless what it makes exists; another worker may make
    it at the same time (or hold /etc/passwd's lock: tried again)."""
    for _ in range(50):
        if exists():
            return
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode == 0 or exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{' '.join(cmd)}: {r.stderr}")


def _exists(lookup: Any, name: str) -> Any:
    def found() -> bool:
        try:
            lookup(name)
            return True
        except KeyError:
            return False

    return found


@pytest.fixture(scope="session")
def accounts() -> dict[str, Account]:
    """The two users (and their group), made once and kept: system users without a
    home or a shell, which another worker or a later run finds and uses as they are."""
    if os.geteuid() != 0:
        pytest.skip("acting as another uid needs root (setpriv, useradd); CI runs as root")
    for tool in ("setpriv", "useradd", "groupadd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (util-linux, passwd)")
    _ensure(["groupadd", "--system", GROUP], _exists(grp.getgrnam, GROUP))
    out = {}
    for name in (ADMIN, MEMBER):
        cmd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        _ensure([*cmd, "--gid", GROUP, name], _exists(pwd.getpwnam, name))
        pw = pwd.getpwnam(name)
        out[name] = Account(name, pw.pw_uid, pw.pw_gid)
    return out


_ENV = {"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONPATH": str(REPO)}
_ENV["PYTHONDONTWRITEBYTECODE"] = "1"
_EXEC_OK: dict[int, bool] = {}


def _may_exec(who: Account, groups: list[int]) -> bool:
    """Whether ``who`` can run this interpreter and import ktctl from this checkout."""
    cmd = [
        *("setpriv", f"--reuid={who.uid}", f"--regid={who.gid}"),
        "--groups=" + ",".join(str(g) for g in groups),
        *(sys.executable, "-c", "import ktctl.client"),
    ]
    return subprocess.run(cmd, env=_ENV, capture_output=True, timeout=60).returncode == 0


def _forked(who: Account, groups: list[int], args: list[str]) -> dict[str, Any]:
    """``CALL`` run in a forked child with ``who``'s uid and ``groups``; its answer
    comes back through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 99
        try:
            os.close(read)
            os.setgroups(groups)
            os.setgid(who.gid)
            os.setuid(who.uid)
            out = io.StringIO()
            sys.argv, sys.stdout = ["-c", *args], out
            exec(compile(CALL, "<call>", "exec"), {"__name__": "__main__"})
            os.write(write, out.getvalue().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    answer: dict[str, Any] = json.loads(data)
    return answer


class Box:
    def __init__(self, root: Path, daemon: DaemonProc, frontend: FrontendProc) -> None:
        self.root = root
        self.daemon = daemon
        self.frontend = frontend
        self.config = root / "etc" / "config.json"
        self.models = root / "etc" / "models.json"
        self.original = (self.config.read_text(), self.models.read_text())

    def as_user(self, who: Account, method: str, **kwargs: Any) -> dict[str, Any]:
        """``Client.<method>(**kwargs)`` in a process of ``who``'s uid, in ``daemon.group``
        and in the group the socket belongs to (the same group once ktd gives the socket
        ``daemon.group``; root's today, issue 43 item 9): ktctl's client under
        ``setpriv``, or, where that uid may not run this interpreter (a venv under
        /root), in a forked child that took the uid (no exec)."""
        groups = sorted({grp.getgrnam(GROUP).gr_gid, os.stat(self.daemon.socket).st_gid})
        args = [str(self.daemon.socket), method, json.dumps(kwargs)]
        if who.uid not in _EXEC_OK:
            _EXEC_OK[who.uid] = _may_exec(who, groups)
        if not _EXEC_OK[who.uid]:
            return _forked(who, groups, args)
        cmd = [
            *("setpriv", f"--reuid={who.uid}", f"--regid={who.gid}"),
            "--groups=" + ",".join(str(g) for g in groups),
            *(sys.executable, "-c", CALL, *args),
        ]
        r = subprocess.run(cmd, env=_ENV, capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        answer: dict[str, Any] = json.loads(r.stdout)
        return answer

    def evil(self, name: str) -> tuple[str, Path]:
        """A program a client must not get run: it leaves ``<name>.ran`` behind."""
        ran = self.root / f"{name}.ran"
        script = self.root / "bin" / name
        script.write_text(f"#!/bin/sh\ntouch {ran}\nexit 3\n")
        script.chmod(0o755)
        return str(script), ran

    def models_with(self, alias: str, **kt: Any) -> str:
        entries = json.loads(self.models.read_text())
        for e in entries:
            if e["alias"] == alias:
                e["kt"].update(kt)
        return json.dumps(entries, indent=2) + "\n"

    def env_with(self, alias: str, **env: str) -> str:
        entries = json.loads(self.models.read_text())
        for e in entries:
            if e["alias"] == alias:
                e["kt"]["extra_env"].update(env)
        return json.dumps(entries, indent=2) + "\n"


@pytest.fixture(scope="module")
def box(accounts: dict[str, Account], shared_marker: str) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="ktd-trust-", dir="/tmp"))
    root.chmod(0o755)  # the other uids reach the runtime dir (its own mode is ktd's)
    (root / "etc").mkdir()
    (root / "bin").mkdir()
    alpha = sim_model("alpha")
    alpha["kt"]["extra_env"]["HF_TOKEN"] = HF_SECRET
    models = [alpha, sim_model("beta", ttl=600)]
    (root / "etc" / "models.json").write_text(json.dumps(models, indent=2) + "\n")
    cfg = {
        "models_file": "models.json",
        "daemon": {
            "group": GROUP,
            "admins": [ADMIN],
            "stop_grace": 5,
            "drain_timeout": 5,
            "health_interval": 1,
        },
        "frontend": {"keys": [{"name": "ops", "key": OPS_KEY, "admin": True}], "ui_control": True},
        "gateway": {"api_key": GATEWAY_SECRET},
    }
    (root / "etc" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    env = own_env()
    env.update(KTD_RUNTIME_DIR=str(root / "run"), KTD_STATE_DIR=str(root / "state"))
    env[MARK] = shared_marker
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    config = root / "etc" / "config.json"
    daemon = DaemonProc(config=config, env=env, log_path=root / "ktd.log").start()
    try:
        frontend = launch_frontend(config, env, root / "frontend.log")
        try:
            yield Box(root, daemon, frontend)
        finally:
            frontend.stop()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _from_the_original(box: Box) -> None:
    """Each test starts from the module's files, put back by the owner through the
    public path when an earlier test changed them (the tests run in any order)."""
    config, models = box.original
    if (box.config.read_text(), box.models.read_text()) != (config, models):
        with box.daemon.client(timeout=60) as c:
            c.config_apply(config_text=config, models_text=models, base=c.config_get().version)
    assert (box.config.read_text(), box.models.read_text()) == (config, models)


def test_a_member_reads_the_config_with_its_secrets_marked_and_may_not_plan_it(
    box: Box, accounts: dict[str, Account]
) -> None:
    member = accounts[MEMBER]
    got = box.as_user(member, "config_get")["reply"]
    shown = got["config_text"] + got["models_text"]
    assert got["redacted"] is True and "secret #" in shown
    assert not [s for s in SECRETS if s in shown]
    assert '"admins"' in got["config_text"] and "HF_TOKEN" in got["models_text"]  # the rest

    python, ran = box.evil("member-python")
    models = box.models_with("alpha", python=python)
    base = got["version"]
    refused = box.as_user(member, "config_plan", models_text=models, base=base)
    assert refused["error"] == "forbidden" and f"uid {member.uid}" in refused["message"]
    refused = box.as_user(member, "config_apply", models_text=models, base=base)
    assert refused["error"] == "forbidden"
    refused = box.as_user(member, "config_rollback", base=base, dry_run=True)
    assert refused["error"] == "forbidden"
    assert not ran.exists()
    assert box.models.read_text() == box.original[1]


def test_an_admins_plan_never_runs_a_new_interpreter_and_the_owners_does(
    box: Box, accounts: dict[str, Account]
) -> None:
    admin = accounts[ADMIN]
    python, ran = box.evil("admin-python")
    base = box.as_user(admin, "config_get")["reply"]["version"]
    models = box.models_with("alpha", python=python)
    plan = box.as_user(admin, "config_plan", models_text=models, base=base)["reply"]
    assert plan["ok"] is False
    [problem] = plan["problems"]
    assert (problem["code"], problem["path"], problem["alias"]) == (
        "forbidden",
        "$[0].kt.python",
        "alpha",
    )
    assert python in problem["message"] and "daemon.pythons" in problem["message"]
    refused = box.as_user(admin, "config_apply", models_text=models, base=base)
    assert refused["error"] == "forbidden" and "$[0].kt.python" in refused["message"]
    assert not ran.exists()
    assert box.models.read_text() == box.original[1]

    # ktd's owner may name a new interpreter (it runs as their uid anyway): its plan
    # runs it (the probe), which is what the admin's never did.
    with box.daemon.client(timeout=60) as c:
        plan_of_owner = c.config_plan(models_text=models, base=base)
    assert ran.exists()
    assert any("cannot run the engine's Python" in q.message for q in plan_of_owner.problems)


def test_an_admin_may_not_set_a_loader_variable_nor_change_config_json(
    box: Box, accounts: dict[str, Account]
) -> None:
    admin = accounts[ADMIN]
    base = box.as_user(admin, "config_get")["reply"]["version"]
    preload = box.env_with("beta", LD_PRELOAD=str(box.root / "evil.so"))
    refused = box.as_user(admin, "config_apply", models_text=preload, base=base)
    assert refused["error"] == "forbidden"
    assert "$[1].kt.extra_env.LD_PRELOAD" in refused["message"]

    elsewhere = box.root / "elsewhere.json"  # a file ktd can write, outside etc/
    cfg = json.loads(box.config.read_text())
    cfg["models_file"] = str(elsewhere)
    text = json.dumps(cfg, indent=2)
    refused = box.as_user(admin, "config_apply", config_text=text, models_text="[]", base=base)
    assert refused["error"] == "forbidden" and "config.json" in refused["message"]
    admins = dict(cfg, models_file="models.json", daemon={**cfg["daemon"], "admins": ["nobody"]})
    refused = box.as_user(admin, "config_plan", config_text=json.dumps(admins), base=base)
    assert refused["reply"]["ok"] is False
    assert refused["reply"]["problems"][0]["code"] == "forbidden"
    assert not elsewhere.exists()
    assert (box.config.read_text(), box.models.read_text()) == box.original


def test_an_admins_change_keeps_the_secrets_it_never_saw(
    box: Box, accounts: dict[str, Account]
) -> None:
    admin = accounts[ADMIN]
    got = box.as_user(admin, "config_get")["reply"]
    assert HF_SECRET not in got["models_text"] and got["redacted"] is True
    # Its mark copied to beta's environment: refused (a secret goes back where it was).
    entries = json.loads(got["models_text"])
    beta = next(e for e in entries if e["alias"] == "beta")
    beta["kt"]["extra_env"]["HF_TOKEN"] = entries[0]["kt"]["extra_env"]["HF_TOKEN"]
    refused = box.as_user(
        admin, "config_apply", models_text=json.dumps(entries), base=got["version"]
    )
    assert refused["error"] == "bad_request" and "stood elsewhere" in refused["message"]
    assert box.models.read_text() == box.original[1]
    text = configtext.set_fields(got["models_text"], "alpha", {"ttl": 45})
    applied = box.as_user(
        admin, "config_apply", config_text=got["config_text"], models_text=text, base=got["version"]
    )
    assert "reply" in applied, applied
    alpha = next(e for e in json.loads(box.models.read_text()) if e["alias"] == "alpha")
    assert alpha["ttl"] == 45 and alpha["kt"]["extra_env"]["HF_TOKEN"] == HF_SECRET
    assert box.config.read_text() == box.original[0]  # the marked config.json: unchanged
    with box.daemon.client() as c:
        newest = c.config_history().versions[0]
    assert (newest.uid, newest.user) == (admin.uid, ADMIN)


def test_the_owner_sees_every_secret_and_must_name_a_base(box: Box) -> None:
    with box.daemon.client(timeout=60) as c:
        got = c.config_get()
        assert not got.redacted
        assert all(s in got.config_text + (got.models_text or "") for s in SECRETS)
        changed = configtext.set_fields(got.models_text or "", "beta", {"ttl": 1})
        with pytest.raises(KtdError) as info:
            c.config_apply(models_text=changed, base="")
    assert info.value.code == "bad_request" and "base is required" in info.value.message
    assert info.value.detail["field"] == "base"
    assert box.models.read_text() == box.original[1]


def test_the_dashboards_admin_key_edits_within_the_same_limits(box: Box) -> None:
    page = {"Authorization": f"Bearer {OPS_KEY}", "X-Ktd-UI": "1"}
    with httpx.Client(base_url=box.frontend.url, headers=page, timeout=60) as http:
        view = http.get("/ui/api/config")
        assert view.status_code == 200
        assert not [s for s in SECRETS if s in view.text] and "secret #" in view.text
        doc = view.json()
        alpha = next(e["entry"] for e in doc["entries"] if e["alias"] == "alpha")
        python, ran = box.evil("dashboard-python")
        entry = {**alpha, "kt": {**alpha["kt"], "python": python}}
        r = http.post(
            "/ui/api/config/plan", json={"base": doc["version"], "alias": "alpha", "entry": entry}
        )
        assert r.status_code == 200, r.text
        [problem] = r.json()["plan"]["problems"]
        assert (problem["code"], problem["path"]) == ("forbidden", "$[0].kt.python")
        r = http.post(
            "/ui/api/config/apply", json={"base": doc["version"], "alias": "alpha", "entry": entry}
        )
        assert r.status_code == 403 and "kt.python" in r.json()["error"]["message"]
        assert not ran.exists()
        env = {**alpha["kt"]["extra_env"], "LD_PRELOAD": str(box.root / "evil.so")}
        entry = {**alpha, "kt": {**alpha["kt"], "extra_env": env}}
        r = http.post(
            "/ui/api/config/apply", json={"base": doc["version"], "alias": "alpha", "entry": entry}
        )
        assert r.status_code == 403 and "LD_PRELOAD" in r.json()["error"]["message"]
        # Within the limits, a change keeps the secret the page never held.
        entry = {**alpha, "ttl": 33}
        r = http.post(
            "/ui/api/config/apply", json={"base": doc["version"], "alias": "alpha", "entry": entry}
        )
        assert r.status_code == 200, r.text
    alpha_now = next(e for e in json.loads(box.models.read_text()) if e["alias"] == "alpha")
    assert alpha_now["ttl"] == 33 and alpha_now["kt"]["extra_env"]["HF_TOKEN"] == HF_SECRET


def test_a_members_dry_run_shows_no_secret_of_the_models_environment(
    box: Box, accounts: dict[str, Account]
) -> None:
    """``load --dry-run`` shows the engine's environment: its own ``extra_env`` values
    (HF_TOKEN among them) are the owner's to see."""
    plan = box.as_user(accounts[MEMBER], "load", alias="alpha", dry_run=True)["reply"]
    assert plan["env"]["HF_TOKEN"] == "(hidden)" and HF_SECRET not in json.dumps(plan)
    with box.daemon.client(timeout=60) as c:
        own = c.load("alpha", dry_run=True)
    assert isinstance(own, dict) and own["env"]["HF_TOKEN"] == HF_SECRET
