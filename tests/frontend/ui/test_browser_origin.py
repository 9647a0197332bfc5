"""A web page of another origin cannot drive the default setup (no keys, bound to
127.0.0.1), in a real Chromium; the frontend's own pages still can. And a DNS-rebinding
``Host`` is refused on the dashboard and the API alike (issue 32)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.frontend.frontend_helpers import free_port
from tests.frontend.ui.conftest import Box, Browser

CHAT = '{"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'


PAGE = "<html><body>a stranger's page</body></html>"


@pytest.fixture
def stranger(tmp_path: Path) -> Iterator[str]:
    """Another site: a plain page served from another port (another origin), no CSP."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE)
    for _ in range(3):  # free_port() can race another process for the port: take another
        proc, url = _serve(site)
        if url is not None:
            break
    else:
        pytest.fail("the stranger's page did not come up on any of 3 ports")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _serve(site: Path) -> tuple[subprocess.Popen[bytes], str | None]:
    """``python -m http.server`` on a free port: its URL once it serves this page (None
    when the server exited or another one answers on that port: it is stopped then)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=site,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).text == PAGE:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.terminate()
    proc.wait(10)
    return proc, None


def test_a_cross_site_page_loads_nothing_and_the_own_page_works(
    box_factory: Callable[..., Box], browser: Browser, stranger: str
) -> None:
    box = box_factory()
    browser.open(stranger + "/")
    for path in ("/v1/chat/completions", "/api/generate", "/generate"):
        # The "simple" request a page may send anywhere without a preflight.
        sent = browser.fetch(
            box.url + path,
            method="POST",
            mode="no-cors",
            headers={"content-type": "text/plain"},
            body=CHAT,
        )
        assert sent["status"] == 0  # opaque to the page, as no-cors always is
    time.sleep(1.0)  # long enough for a load to have been asked for (0.1 s in the sim)
    assert box.daemon.engines()["alpha"]["state"] == "stopped"
    # The frontend's own page, same origin: its requests are answered.
    browser.open(box.url + "/ui")
    own = browser.fetch("/ui/api/view")
    assert own["status"] == 200 and "alpha" in own["text"]
    models = browser.fetch("/v1/models")
    assert models["status"] == 200 and "alpha" in models["text"]


def test_a_rebinding_host_is_refused_on_the_dashboard_and_the_api(
    box_factory: Callable[..., Box],
) -> None:
    box = box_factory()
    evil = {"host": "evil.example"}
    with httpx.Client(base_url=box.url, timeout=10) as c:
        for path in ("/ui", "/ui/api/view", "/v1/models", "/api/tags", "/metrics", "/health"):
            refused = c.get(path, headers=evil)
            assert refused.status_code == 403, path
            assert "evil.example" in refused.text and "alpha" not in refused.text
        assert c.get("/api/tags", headers=evil).json().keys() == {"error"}  # Ollama's shape
        # Its own names are answered.
        for host in ("localhost", "127.0.0.1", "[::1]", "app.localhost"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
