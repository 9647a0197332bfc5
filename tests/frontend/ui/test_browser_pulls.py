"""The dashboard's pulls panel in a real browser (issue 44): a real daemon pulls from the
hub stand-in at a slow rate, and the page shows the job's bar moving (file, bytes done of
the total, rate, ETA, state) to its end, from the daemon's ``pulls`` and ``pull.`` events
through the frontend; a failed pull shows its kind and message. Only a browser that showed
a key sees any of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.frontend.ui.conftest import Browser
from tests.frontend.ui.uienv import box_models
from tests.hub.standin import Repo, StandIn

MiB = 1 << 20
KEY, OTHER = "sk-pulls-ops", "sk-pulls-viewer"
KEYS = [{"name": "ops", "key": KEY, "admin": True}, {"name": "viewer", "key": OTHER}]
ROW = '#pulls .pull[data-key="org/slow@main"]'
GONE = '#pulls .pull[data-key="org/gone@main"]'


def test_a_pull_moves_its_bar_to_the_end_and_a_failed_one_says_why(
    tmp_path: Path,
    box_env: dict[str, str],
    write_config: Any,
    daemon_factory: Any,
    frontend_factory: Any,
    browser: Browser,
) -> None:
    hub = StandIn()
    hub.add(Repo("org/slow", {"config.json": b"{}\n", "model.safetensors": os.urandom(3 * MiB)}))
    hub.rate = 1 * MiB  # three seconds of bytes: the bar is seen on its way
    with hub:
        cfg = write_config(box_models(tmp_path / "models"), frontend={"keys": KEYS})
        data = json.loads(cfg.read_text())
        data["catalog"] = {"dir": str(tmp_path / "pulled")}
        cfg.write_text(json.dumps(data))
        env = {**box_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
        daemon = daemon_factory(cfg, env=env)
        fe = frontend_factory(cfg, env=env)

        b = browser
        # No key shown: the page asks for one, and its data (the pulls with the rest) is 401.
        b.open(fe.url + "/ui")
        b.wait("the key form", lambda: b.visible("#login"))
        assert not b.visible("#dash") and b.count("#pulls .pull") == 0
        assert b.fetch("ui/api/view")["status"] == 401
        assert b.fetch("ui/api/events")["status"] == 401
        assert all("401" in e["message"] for e in b.errors()), b.errors()
        b.logs.clear()  # those two were ours

        b.open(fe.url + "/ui?token=" + OTHER)  # any key that may see the dashboard
        b.wait("no pull yet", lambda: "No pull job." in b.text("#pulls"))

        r = daemon.ktctl("pull", "--repo", "org/slow", "--detach")
        assert r.returncode == 0, r.stdout + r.stderr
        seen: list[int] = []

        def moving() -> bool:
            row = b.js(
                "const el = document.querySelector(arguments[0]);"
                "return el && {state: el.dataset.state, phase: el.dataset.phase,"
                " done: +el.dataset.done, total: +el.dataset.total,"
                " width: el.querySelector('.progress > div').style.width,"
                " text: el.textContent}",
                ROW,
            )
            if not row or row["state"] != "running" or row["phase"] != "fetch":
                return False
            if 0 < row["done"] < row["total"] and row["done"] not in seen:
                seen.append(row["done"])
                assert row["width"].endswith("%") and 0 < float(row["width"][:-1]) < 100, row
                assert "model.safetensors" in row["text"] and "of 3.0 MiB" in row["text"], row
                assert "/s" in row["text"] and "ETA" in row["text"], row
            return len(seen) >= 3

        b.wait("the bar moving", moving)
        assert seen == sorted(seen), seen
        b.wait("the pull done", lambda: b.attrs(ROW, "data-state") == ["done"])
        done, total = b.attrs(ROW, "data-done")[0], b.attrs(ROW, "data-total")[0]
        assert done == total and int(total or 0) > 3 * MiB
        assert b.js("return document.querySelector(arguments[0] + ' .progress > div')"
                    ".style.width", ROW) == "100%"  # fmt: skip
        assert "3.0 MiB of 3.0 MiB" in b.text(ROW) and not b.visible(ROW + " .pull-error")

        r = daemon.ktctl("pull", "--repo", "org/gone", "--detach")
        b.wait("the failed pull", lambda: b.attrs(GONE, "data-state") == ["failed"])
        assert b.attrs(GONE, "data-kind") == ["missing"]
        assert b.visible(GONE + " .pull-error")
        error = b.text(GONE + " .pull-error")
        assert error.startswith("missing: ") and "404" in error, error
        assert "failed (missing)" in b.text(GONE) and "nothing fetched" in b.text(GONE)
        assert b.count("#pulls .pull") == 2

        # A page opened afterwards gets the jobs from the daemon's `pulls`, not only events.
        b.forget_cookies()
        b.open(fe.url + "/ui?token=" + KEY)
        b.wait("both jobs", lambda: b.attrs("#pulls .pull", "data-state") == ["done", "failed"])
        assert b.errors() == []
