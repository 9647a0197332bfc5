"""The dashboard in a real browser (Debian's chromium), against a real daemon, frontend and
sim engines on the two-node box: what an operator sees, live, and what a stranger does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from tests.frontend.ui.conftest import Box, Browser

CHAT = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def open_dashboard(b: Browser, url: str) -> None:
    b.open(url)
    b.wait("the cards", lambda: b.count(".card") == 3)
    b.wait("the live stream", lambda: b.text("#conn-text") == "live")


def stat(b: Browser, alias: str, label: str) -> str | None:
    """The value a card's stat shows under ``label``."""
    got = b.js(
        """const [alias, label] = arguments;
        for (const s of document.querySelectorAll(`.card[data-alias="${alias}"] .stat`))
          if (s.lastChild.textContent === label) return s.firstChild.textContent;  // b, span
        return null;""",
        alias,
        label,
    )
    return None if got is None else str(got)


def test_models_machine_a_live_load_its_log_and_plan(
    box_factory: Callable[..., Box], browser: Browser
) -> None:
    box = box_factory()
    b = browser
    open_dashboard(b, box.url + "/ui")
    assert b.attrs(".card", "data-alias") == ["alpha", "beta", "qwen3"]
    assert b.card_state("alpha") == "stopped" and b.card_state("beta") == "stopped"
    assert b.card_state("qwen3") == "not served"
    assert "ds4" in b.text(".card[data-alias=qwen3] .phase")
    b.wait("the machine", lambda: b.count("[data-node]") == 2 and b.count("[data-gpu]") == 2)
    assert "Fake Xeon" in b.text("#cpu-model")
    assert "NVIDIA L40S" in b.text("[data-gpu='0']")

    b.js("window.__same_page = true")
    box.ktctl("load", "alpha")
    b.wait("alpha ready, without a reload", lambda: b.card_state("alpha") == "ready")
    assert b.js("return window.__same_page") is True
    b.wait("node 0 and GPU 0 held by alpha", lambda: "alpha" in b.text("[data-node='0'] .chip"))
    assert "alpha" in b.text("[data-gpu='0'] .chip") and not b.count("[data-node='1'] .chip")
    assert "127.0.0.1:" in b.text(".card[data-alias=alpha] .url")
    assert stat(b, "alpha", "in flight") == "0"  # the card reads the view's in_flight

    # Selected: its log tail (without ktd's probe lines), then new lines as they come.
    b.click(".card[data-alias=alpha]")
    b.wait("the log tail", lambda: "[ktd] ready on" in b.text("#logs"))
    assert httpx.post(box.url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
    b.wait("the request's line, live", lambda: "POST /v1/chat/completions" in b.text("#logs"))
    assert "ktd=probe" not in b.text("#logs")
    # The dry-run and the estimate of loading it, drawn on the machine.
    b.wait("the plan", lambda: "Dry-run: loading alpha" in b.text("#plan"))
    assert "NUMA node 0" in b.text("#plan") and "GPU 0" in b.text("#plan")
    assert "fits" in b.text("#plan")
    assert "planned" in (b.attrs("[data-node='0']", "class")[0] or "")
    # argv on demand, and no secret in it.
    b.click(".card[data-alias=alpha] details summary")
    argv = b.text(".card[data-alias=alpha] .argv")
    assert "--enable-metrics" in argv and "--kt-numa-nodes" in argv
    # The plots are drawn (data comes with the samples; tests/frontend/ui/test_hub.py).
    assert set(b.attrs("#plots svg", "data-metric")) == {
        "rps",
        "tps",
        "ttft",
        "engine_ttft",
        "loads",
    }
    b.wait("alpha's load in the history", lambda: b.count("#plots svg[data-metric=loads] rect"))
    assert not b.count("button.load"), "actions are off by default"
    assert b.errors() == []


def test_a_key_is_asked_for_kept_in_a_cookie_and_taken_from_a_link(
    box_factory: Callable[..., Box], browser: Browser
) -> None:
    key = "sk-ui-secret-41"
    box = box_factory(frontend={"api_keys": [key]})
    b = browser
    b.open(box.url + "/ui")
    b.wait("the key form", lambda: b.visible("#login-form"))
    assert not b.count(".card") and not b.visible("#dash")
    for path in ("ui/api/view", "ui/api/series", "ui/api/events", "ui/api/logs?alias=alpha"):
        assert b.fetch(path)["status"] == 401, path
    assert key not in b.driver.page_source
    # A wrong key is refused; the right one opens the dashboard.
    field = b.driver.find_element("css selector", "#key")
    field.send_keys("sk-wrong")
    b.click("#login-submit")
    b.wait("the refusal", lambda: "not one of" in b.text("#login-error"))
    field.clear()
    field.send_keys(key)
    b.click("#login-submit")
    b.wait("the cards", lambda: b.count(".card") == 3)
    [cookie] = b.cookies()
    assert cookie["name"] == "ktd_ui" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui/api"  # the login URL's directory: sent to the data only
    assert key not in cookie["value"]
    assert b.js("return document.cookie") == ""  # no script can read it
    assert b.fetch("ui/api/view")["status"] == 200
    # A reload keeps the session; signing out ends it.
    b.open(box.url + "/ui")
    b.wait("the cards again", lambda: b.count(".card") == 3)
    b.click("#logout")
    b.wait("the key form again", lambda: b.visible("#login"))
    assert b.fetch("ui/api/view")["status"] == 401

    # Wrong keys make 401s, which the console reports; nothing else went wrong.
    assert all("401" in e["message"] for e in b.errors()), b.errors()
    b.logs.clear()

    # No cookie, and a link with ?token=KEY: in at once, and the key leaves the address bar.
    b.forget_cookies()
    b.open(box.url + "/ui?token=" + key)
    b.wait("the cards", lambda: b.count(".card") == 3)
    assert b.driver.current_url == box.url + "/ui"
    assert key not in b.js("return location.href + document.referrer")
    assert [c["name"] for c in b.cookies()] == ["ktd_ui"]
    assert b.errors() == []
    # The frontend never logged the key.
    assert key not in box.frontend.output()


def test_buttons_only_with_ui_control_and_a_key(
    box_factory: Callable[..., Box], browser: Browser
) -> None:
    key = "sk-ui-admin"
    box = box_factory(frontend={"api_keys": [key], "ui_control": True})
    b = browser
    open_dashboard(b, box.url + "/ui?token=" + key)
    b.wait("the reload button", lambda: b.visible("#reload-config"))
    b.click(".card[data-alias=beta] button.load")
    b.wait("beta ready", lambda: b.card_state("beta") == "ready", timeout=60)
    assert "beta" in b.text("[data-node='1'] .chip")
    b.click(".card[data-alias=beta] button.evict")
    confirm = ".card[data-alias=beta] button.evict.danger"
    b.wait("the confirmation", lambda: b.text(confirm) == "Confirm evict")
    b.click(confirm)
    b.wait("beta stopped", lambda: b.card_state("beta") == "stopped", timeout=60)
    b.click("#reload-config")
    b.wait("the reload's answer", lambda: b.visible("#toast"))
    # Without the page's header (a forged form post), the same cookie presses nothing.
    forged = b.fetch(
        "ui/api/action",
        method="POST",
        headers={"Content-Type": "application/json"},
        body='{"action": "load", "alias": "beta"}',
    )
    assert forged["status"] == 403
    assert b.errors() == [] or all("403" in e["message"] for e in b.errors())


def test_it_reconnects_by_itself_after_a_frontend_and_a_daemon_restart(
    box_factory: Callable[..., Box], frontend_factory: Callable[..., object], browser: Browser
) -> None:
    box = box_factory()
    b = browser
    open_dashboard(b, box.url + "/ui")
    b.js("window.__same_page = true")
    port = int(box.url.rsplit(":", 1)[1])
    box.frontend.stop()
    b.wait("the page notices", lambda: b.text("#conn-text") != "live")
    frontend_factory(box.config, env=box.env, port=port)
    b.wait("live again", lambda: b.text("#conn-text") == "live")
    box.ktctl("load", "alpha")
    b.wait("alpha ready, seen through the new frontend", lambda: b.card_state("alpha") == "ready")

    box.daemon.stop()
    b.wait("the daemon's absence", lambda: b.visible("#banner"), timeout=60)
    box.daemon.start()
    b.wait("the daemon back", lambda: not b.visible("#banner"), timeout=60)
    box.ktctl("load", "beta")
    b.wait("beta ready, seen through the new daemon", lambda: b.card_state("beta") == "ready")
    assert b.js("return window.__same_page") is True


def test_under_a_path_prefix_through_a_unix_bind(
    box_factory: Callable[..., Box],
    prefix_proxy: Callable[[str, str], object],
    tmp_path: Path,
    browser: Browser,
) -> None:
    sock = tmp_path / "fe.sock"
    box = box_factory(unix=sock)
    proxy = prefix_proxy("/box", f"unix:{sock}")
    b = browser
    open_dashboard(b, f"{proxy.url}/ui/")  # type: ignore[attr-defined]
    box.ktctl("load", "alpha")
    b.wait("alpha ready", lambda: b.card_state("alpha") == "ready")
    b.click(".card[data-alias=alpha]")
    b.wait("the log tail", lambda: "[ktd] ready on" in b.text("#logs"))
    b.wait("the plan", lambda: "Dry-run: loading alpha" in b.text("#plan"))
    assert b.errors() == []
