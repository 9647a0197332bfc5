"""Fixtures for the dashboard: the two-node box (a real daemon and frontend), a real browser.

The browser is Debian's chromium driven through its own chromedriver (both from apt:
``tests/ui_install.sh``; how it is started: chrome.py), one per pytest process (a start
and a quit cost a second), put back before and after each test: a blank page, the other
windows closed, no cookie, an empty cache, the console's lines dropped, so that
nothing leaks from one test to the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MARK
from tests.frontend.ui.chrome import start_chrome
from tests.frontend.ui.uienv import box_models, machine_env


@dataclass
class Box:
    """A daemon and a frontend on the two-node box (uienv.py)."""

    daemon: Any
    frontend: Any
    config: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        return str(self.frontend.url)

    def ktctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        r: subprocess.CompletedProcess[str] = self.daemon.ktctl(*args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r


@pytest.fixture
def box_env(tmp_path: Path, ktd_env: dict[str, str]) -> dict[str, str]:
    return machine_env(tmp_path, ktd_env)


@pytest.fixture
def box_factory(
    tmp_path: Path,
    box_env: dict[str, str],
    write_config: Any,
    daemon_factory: Any,
    frontend_factory: Any,
) -> Callable[..., Box]:
    def make(*, frontend: dict[str, Any] | None = None, **fe: Any) -> Box:
        cfg = write_config(box_models(tmp_path / "models"), frontend=frontend or {})
        daemon = daemon_factory(cfg, env=box_env)
        front = frontend_factory(cfg, env=box_env, **fe)
        return Box(daemon=daemon, frontend=front, config=cfg, env=box_env)

    return make


# ---------------------------------------------------------------- the browser


class Browser:
    def __init__(self, profile: Path, env: dict[str, str] | None = None) -> None:
        self.driver = start_chrome(profile, "--window-size=1400,1400", console=True, env=env)
        self.logs: list[dict[str, Any]] = []

    def reset(self) -> None:
        """As a fresh profile's: one window on a blank page (which leaves the last page's
        event stream), no cookie, an empty cache, no console line kept."""
        first, *others = self.driver.window_handles
        for handle in others:
            self.driver.switch_to.window(handle)
            self.driver.close()
        self.driver.switch_to.window(first)
        self.driver.get("about:blank")
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        self.driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        self.driver.get_log("browser")
        self.logs = []

    def open(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def fetch(self, path: str, **init: Any) -> dict[str, Any]:
        """``fetch(path)`` from inside the page: what the page's own requests get."""
        script = """
            const [path, init, done] = arguments;
            fetch(path, init).then(async (r) => done({status: r.status, text: await r.text()}),
                                   (e) => done({status: 0, text: String(e)}));
        """
        result: dict[str, Any] = self.driver.execute_async_script(script, path, init)
        return result

    def wait(self, what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = cond()
            except Exception as exc:  # a node replaced while we read it: look again
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r})")

    # The page redraws its cards on every change, so an element found in one call may be
    # gone by the next: every read and click below is one script run, atomic in the page.

    def count(self, selector: str) -> int:
        return int(self.js("return document.querySelectorAll(arguments[0]).length", selector))

    def text(self, selector: str) -> str:
        got = self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector
        )
        return str(got)

    def attrs(self, selector: str, name: str) -> list[str | None]:
        got: list[str | None] = self.js(
            "const all = document.querySelectorAll(arguments[0]);"
            "return [...all].map(e => e.getAttribute(arguments[1]));",
            selector,
            name,
        )
        return got

    def visible(self, selector: str) -> bool:
        return bool(
            self.js(
                "const e = document.querySelector(arguments[0]);"
                "return !!e && !e.closest('[hidden]') && e.getClientRects().length > 0;",
                selector,
            )
        )

    def click(self, selector: str) -> None:
        """Click the element now matching ``selector`` (waiting for one to exist)."""
        self.wait(
            f"{selector} to click",
            lambda: self.js(
                "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;",
                selector,
            ),
        )

    def card_state(self, alias: str) -> str | None:
        got = self.attrs(f".card[data-alias='{alias}']", "data-state")
        return got[0] if got else None

    def forget_cookies(self) -> None:
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})

    def cookies(self) -> list[dict[str, Any]]:
        """Every cookie of the profile, whatever its path (WebDriver shows the page's only)."""
        got: dict[str, Any] = self.driver.execute_cdp_cmd("Network.getAllCookies", {})
        return list(got["cookies"])

    def console(self) -> list[dict[str, Any]]:
        """Everything the console said since the last call (kept in ``logs``)."""
        got: list[dict[str, Any]] = self.driver.get_log("browser")
        self.logs.extend(got)
        return got

    def errors(self) -> list[dict[str, Any]]:
        self.console()
        return [e for e in self.logs if e.get("level") == "SEVERE"]

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture(scope="session")
def shared_browser(
    tmp_path_factory: pytest.TempPathFactory, session_marker: str
) -> Iterator[Browser]:
    """The session's Chromium, under the session's leak-check marker."""
    b = Browser(tmp_path_factory.mktemp("chrome"), env={**os.environ, MARK: session_marker})
    yield b
    b.quit()


@pytest.fixture
def browser(shared_browser: Browser) -> Iterator[Browser]:
    shared_browser.reset()
    yield shared_browser
    shared_browser.reset()


# ---------------------------------------------------------------- a prefix proxy


@dataclass
class PrefixProxy:
    url: str
    proc: subprocess.Popen[bytes]


@pytest.fixture
def prefix_proxy(tmp_path: Path) -> Iterator[Callable[[str, str], PrefixProxy]]:
    started: list[PrefixProxy] = []

    def start(prefix: str, upstream: str) -> PrefixProxy:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.frontend.ui.prefix_proxy", prefix, upstream],
            stdout=subprocess.PIPE,
            stderr=open(tmp_path / "proxy.log", "ab"),  # noqa: SIM115
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        port = json.loads(line)["port"]
        proxy = PrefixProxy(url=f"http://127.0.0.1:{port}{prefix}", proc=proc)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.proc.terminate()
        proxy.proc.wait(10)


# ---------------------------------------------------------------- server-sent events


async def sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """``(event, parsed data)`` from an SSE response, as a browser's EventSource reads it."""
    buf = b""
    async for chunk in resp.aiter_bytes():
        buf += chunk
        while b"\n\n" in buf:
            raw, buf = buf.split(b"\n\n", 1)
            name, data = "message", None
            for line in raw.split(b"\n"):
                if line.startswith(b"event: "):
                    name = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = json.loads(line[6:])
            if data is not None:
                yield name, data
