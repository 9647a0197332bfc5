"""Debian's chromium under selenium, offline: one place for how the tests, the latency
bench and the screenshot script start it.

selenium is given the system chromedriver's path, so Selenium Manager never runs and
nothing is downloaded; the flags keep Chromium off the network (this machine refuses
its background connections) and ``profile`` is a fresh user-data dir each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def start_chrome(
    profile: Path, *flags: str, console: bool = False, env: Mapping[str, str] | None = None
) -> Any:
    """A ``webdriver.Chrome``; ``console``: keep the page's console for ``get_log``;
    ``env``: chromedriver's environment (and so Chromium's), else this process's."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    if console:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, env=dict(env) if env is not None else None)
    return webdriver.Chrome(service=service, options=options)
