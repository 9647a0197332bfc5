"""The dashboard's config editor in a real browser (Debian's chromium), against a real
daemon, frontend and sim engines (issue 39): a model's settings as a form, planned then
applied; models.json as text with its secrets kept out of the page; the history and a
rollback; a second browser that changed the config meanwhile; markup in every field
shown as text; and the editor only for an admin key with ``ui_control``.

One daemon and one frontend for the module: each test reads the version it starts from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ktd.core import configtext
from tests.conftest import MARK, DaemonProc, own_env, sim_model, wait_for
from tests.frontend.conftest import FrontendProc, launch_frontend
from tests.frontend.ui.conftest import Browser

REPO = Path(__file__).resolve().parents[3]
OPS, VIEWER = "sk-cfg-ops", "sk-cfg-viewer"
KEYS = [{"name": "ops", "key": OPS, "admin": True}, {"name": "viewer", "key": VIEWER}]
SECRET = "hf_a-secret-token-41"
PAYLOAD = '"><img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


class Stack:
    def __init__(self, root: Path, daemon: DaemonProc, frontend: FrontendProc) -> None:
        self.root = root
        self.daemon = daemon
        self.frontend = frontend
        self.models = root / "etc" / "models.json"
        self.original = self.models.read_text()

    @property
    def url(self) -> str:
        return self.frontend.url

    def ktctl(self, *args: str, env: dict[str, str] | None = None) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "ktctl", "--socket", str(self.daemon.socket), *args],
            env={**self.daemon.env, **(env or {})}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def entry(self, alias: str) -> dict[str, Any]:
        return next(e for e in json.loads(self.models.read_text()) if e["alias"] == alias)


@pytest.fixture(scope="module")
def stack(shared_marker: str) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="ktd-uicfg-", dir="/tmp"))
    etc = root / "etc"
    etc.mkdir()
    alpha = sim_model("alpha", kt={"extra_args": ["--enable-metrics"]})
    alpha["kt"]["extra_env"]["HF_TOKEN"] = SECRET
    models = [alpha, sim_model("beta", ttl=600), {"path": "/m/q", "backend": "ds4", "alias": "q"}]
    (etc / "models.json").write_text(json.dumps(models, indent=2) + "\n")
    cfg = {
        "models_file": "models.json",
        "daemon": {"stop_grace": 5, "drain_timeout": 5, "health_interval": 1},
        "frontend": {"keys": KEYS, "ui_control": True},
    }
    (etc / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    env = own_env()
    env.update(KTD_RUNTIME_DIR=str(root / "run"), KTD_STATE_DIR=str(root / "state"))
    env[MARK] = shared_marker
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    daemon = DaemonProc(config=etc / "config.json", env=env, log_path=root / "ktd.log").start()
    try:
        frontend = launch_frontend(etc / "config.json", env, root / "frontend.log")
        try:
            yield Stack(root, daemon, frontend)
        finally:
            frontend.stop()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _from_the_original(stack: Stack) -> None:
    """Each test starts from the module's models.json, put back through the public
    path (a config apply) when an earlier test changed it: the tests run in any order
    (pytest-xdist's worksteal hands them out one by one)."""
    if stack.models.read_text() != stack.original:
        path = stack.root / "original.json"
        path.write_text(stack.original)
        stack.ktctl("config", "apply", str(path), "--yes")
    assert stack.models.read_text() == stack.original


def open_editor(b: Browser, stack: Stack, alias: str = "alpha") -> None:
    b.open(stack.url + "/ui?token=" + OPS)
    b.wait("the editor's panel", lambda: b.visible("#cfg-open"))
    b.click(f".card[data-alias='{alias}'] button.edit")
    b.wait(
        f"{alias}'s form",
        lambda: b.js("return document.querySelector('#cfg-model').value") == alias,
    )


def field(b: Browser, name: str) -> str:
    return str(
        b.js(
            "return document.querySelector(`#cfg-form [data-field='${arguments[0]}']`).value", name
        )
    )


def fill(b: Browser, name: str, value: str) -> None:
    b.js(
        """const e = document.querySelector(`#cfg-form [data-field='${arguments[0]}']`);
        e.value = arguments[1]; e.dispatchEvent(new Event('input'));""",
        name,
        value,
    )


def plan(b: Browser) -> str:
    b.js("document.querySelector('#cfg-plan').replaceChildren()")
    b.click("#cfg-plan-btn")
    return str(b.wait("the plan", lambda: b.text("#cfg-plan")))


def apply(b: Browser) -> None:
    b.wait(
        "Apply enabled", lambda: b.js("return !document.querySelector('#cfg-apply-btn').disabled")
    )
    b.click("#cfg-apply-btn")


def test_a_models_settings_as_a_form_planned_applied_and_rolled_back(
    stack: Stack, browser: Browser
) -> None:
    b = browser
    before = stack.models.read_text()
    open_editor(b, stack)
    assert field(b, "path") == stack.entry("alpha")["path"] and field(b, "ttl") == ""
    assert "idle seconds before it is evicted" in b.text("[data-row='ttl'] .help")
    # A value the form cannot read is said under its field; nothing is sent.
    fill(b, "kt.ctx", "lots")
    b.click("#cfg-plan-btn")
    b.wait(
        "the field's error",
        lambda: b.text("[data-error-for='kt.ctx']") == "expected a whole number",
    )
    fill(b, "kt.ctx", "")
    # A path that does not exist: the daemon's words, under the field.
    fill(b, "path", "/nonexistent/alpha")
    text = plan(b)
    assert "error:" in text and "$[0].path: model_path /nonexistent/alpha does not exist" in text
    assert "does not exist" in b.text("[data-error-for='path']")
    assert b.js("return document.querySelector('#cfg-apply-btn').disabled") is True
    fill(b, "path", stack.entry("alpha")["path"])

    fill(b, "ttl", "45")
    text = plan(b)
    assert "alpha\tupdate" in text or "alpha update" in text.replace("\t", " ")
    assert "ttl: 0 → 45" in text
    fill(b, "ttl", "46")  # changed after the plan: Apply waits for a new plan
    b.wait("the stale note", lambda: "plan again" in b.text("#cfg-plan-note"))
    assert b.js("return document.querySelector('#cfg-apply-btn').disabled") is True
    plan(b)
    apply(b)
    b.wait("applied", lambda: "applied version" in b.text("#toast"))
    assert stack.models.read_text() == configtext.set_fields(before, "alpha", {"ttl": 46})
    assert SECRET in stack.models.read_text()  # the marked secret went back as it was
    wait_for(lambda: stack.daemon.engines()["alpha"]["ttl"] == 46, what="alpha's new ttl")

    # The history: who (the key, as claimed by the frontend) and what; a rollback.
    b.click("#cfg-tab-history")
    b.wait("the history", lambda: "key ops (dashboard)" in b.text("#cfg-history"))
    newest = b.attrs("#cfg-history tbody tr", "data-seq")[0]
    assert "update: alpha (ttl)" in b.text(f"#cfg-history tr[data-seq='{newest}']")
    previous = str(int(newest or 0) - 1)
    b.click(f"#cfg-history tr[data-seq='{previous}'] button.rollback")
    b.wait("the rollback's plan", lambda: "ttl: 46 → 0" in b.text("#cfg-plan"))
    apply(b)
    b.wait("rolled back", lambda: stack.models.read_text() == before)
    b.wait(
        "the rollback in the history", lambda: f"rollback of #{previous}" in b.text("#cfg-history")
    )
    assert b.errors() == []


def test_the_raw_view_never_holds_a_secret_and_keeps_it_in_the_file(
    stack: Stack, browser: Browser
) -> None:
    b = browser
    open_editor(b, stack)
    # Every value of extra_env is marked (the types mark the field, not the names);
    # the numbers run on from config.json's own secrets.
    env = json.loads(field(b, "kt.extra_env"))
    assert env["HF_TOKEN"].startswith("•••• secret #") and SECRET not in json.dumps(env)
    b.click("#cfg-tab-raw")
    raw = str(b.js("return document.querySelector('#cfg-raw').value"))
    assert env["HF_TOKEN"] in raw and SECRET not in raw
    assert SECRET not in b.driver.page_source
    # The raw text as the user edits it: beta's TTL, in the file's own layout.
    changed = raw.replace('"ttl": 600', '"ttl": 300')
    b.js("const e = document.querySelector('#cfg-raw'); e.value = arguments[0];"
         "e.dispatchEvent(new Event('input'));", changed)  # fmt: skip
    assert "beta" in plan(b) and "ttl: 600 → 300" in b.text("#cfg-plan")
    apply(b)
    b.wait("applied", lambda: stack.entry("beta")["ttl"] == 300)
    text = stack.models.read_text()
    assert SECRET in text and "secret #" not in text
    assert b.errors() == []


def test_a_second_browser_that_changed_the_config_meanwhile_makes_the_first_stale(
    stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    first = browser
    second = Browser(tmp_path / "chrome-2")
    try:
        open_editor(first, stack, "beta")
        open_editor(second, stack, "beta")
        fill(first, "ttl", "22")
        assert "ttl: 600 → 22" in plan(first)
        fill(second, "ttl", "11")
        plan(second)
        apply(second)
        second.wait("the second's change applied", lambda: stack.entry("beta")["ttl"] == 11)
        apply(first)
        first.wait("stale, said", lambda: first.visible("#cfg-error.stale"))
        assert "someone changed the configuration meanwhile" in first.text("#cfg-error")
        assert "Nothing was applied" in first.text("#cfg-error")
        assert stack.entry("beta")["ttl"] == 11
        first.click("#cfg-reload")
        first.wait("the editor on what is there", lambda: field(first, "ttl") == "11")
        assert not first.visible("#cfg-error")
        assert second.errors() == []
        assert all("409" in e["message"] for e in first.errors()), first.errors()
    finally:
        second.quit()


def test_markup_in_every_field_is_shown_as_text(stack: Stack, browser: Browser) -> None:
    b = browser
    # Every string field of an entry, the history's claimed author, and a plan's messages.
    doc = json.loads(stack.models.read_text())
    doc[2] = {
        "path": PAYLOAD,
        "backend": "ds4" + PAYLOAD,
        "alias": "q<i>x",
        "kt": {
            "kt_weight_path": PAYLOAD,
            "python": PAYLOAD,
            "extra_args": [PAYLOAD],
            "extra_env": {"NOTE": PAYLOAD},
        },
    }
    doc[0]["kt"]["extra_env"]["NOTE"] = PAYLOAD
    path = stack.root / "payload.json"
    path.write_text(json.dumps(doc, indent=2))
    stack.ktctl("config", "apply", str(path), "--yes", env={"USER": PAYLOAD, "LOGNAME": PAYLOAD})
    open_editor(b, stack, "q<i>x")
    for name in ("path", "kt.kt_weight_path", "kt.python"):
        assert field(b, name) == PAYLOAD, name
    assert field(b, "backend") == "ds4" + PAYLOAD
    assert field(b, "kt.extra_args") == json.dumps([PAYLOAD])
    assert field(b, "alias") == "q<i>x"
    fill(b, "path", PAYLOAD + "2")
    assert f"path: {json.dumps(PAYLOAD)} → {json.dumps(PAYLOAD + '2')}" in plan(b)
    b.js("document.querySelector('#cfg-model').value = 'alpha';"
         "document.querySelector('#cfg-model').dispatchEvent(new Event('change'))")  # fmt: skip
    fill(b, "path", "/nonexistent/" + PAYLOAD)
    assert f"model_path /nonexistent/{PAYLOAD} does not exist" in plan(b)
    b.click("#cfg-tab-raw")
    raw = str(b.js("return document.querySelector('#cfg-raw').value"))
    assert json.dumps(PAYLOAD) in raw  # the file's text, as JSON spells it
    b.click("#cfg-tab-history")
    b.wait("the claimed author", lambda: f'claimed "{PAYLOAD}"' in b.text("#cfg-history"))
    assert "q<i>x" in b.text(".card[data-alias='q<i>x'] .alias")
    assert b.js("return window.__xss === undefined") is True
    assert b.count("img") == 0 and b.count("script") == 1
    assert b.count("#cards i, #config-panel i, #toast i") == 0  # "q<i>x" is no element
    assert b.errors() == []


def test_the_editor_is_for_an_admin_key_with_ui_control(stack: Stack, browser: Browser) -> None:
    page = {"X-Ktd-UI": "1"}
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        r = c.get("/ui/api/config", headers={"Authorization": f"Bearer {VIEWER}", **page})
        assert r.status_code == 403 and "not allowed" in r.json()["error"]["message"]
        r = c.get("/ui/api/config", headers={"Authorization": f"Bearer {OPS}"})  # no page header
        assert r.status_code == 403
        r = c.get("/ui/api/config")
        assert r.status_code == 401
        r = c.get("/ui/api/config", headers={"Authorization": f"Bearer {OPS}", **page})
        assert r.status_code == 200 and SECRET not in r.text
        version = r.json()["version"]
        body = {"base": version, "alias": "beta", "entry": {"path": "/x"}}
        r = c.post("/ui/api/config/apply", json=body,
                   headers={"Authorization": f"Bearer {VIEWER}", **page})  # fmt: skip
        assert r.status_code == 403
        r = c.post("/ui/api/config/plan", json={**body, "base": "0" * 12},
                   headers={"Authorization": f"Bearer {OPS}", **page})  # fmt: skip
        assert r.status_code == 409 and r.json()["error"]["code"] == "stale_config"
    b = browser
    b.open(stack.url + "/ui?token=" + VIEWER)
    b.wait("the cards", lambda: b.count(".card") == 3)
    assert not b.visible("#config-panel") and not b.count("button.edit")
