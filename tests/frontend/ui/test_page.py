"""The page ships whole in the package: no URL outside it, a CSP that names its own parts."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

import pytest

from ktd.frontend import ui
from ktd.frontend.ui import page, wire


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_assemble_and_csp_hashes() -> None:
    built = page.assemble(
        "<style>{{style}}</style><link href='{{favicon}}'><script>{{script}}</script>",
        "body{}",
        ["var a=1;", "var b=2;"],
        "<svg/>",
    )
    html = built.html.decode()
    assert "<script>var a=1;\nvar b=2;</script>" in html
    assert f"script-src {_sha('var a=1;' + chr(10) + 'var b=2;')}" in built.csp
    assert f"style-src {_sha('body{}')}" in built.csp
    assert "data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode() in html
    assert "default-src 'none'" in built.csp and "frame-ancestors 'none'" in built.csp
    with pytest.raises(ValueError):
        page.assemble("{{script}}", "", ["x='</script>'"], "")


def test_the_packaged_page_is_whole_and_its_csp_matches_what_it_embeds() -> None:
    built = page.load()
    html = built.html.decode()
    assert "{{" not in html
    script = re.search(r"<script>(.*)</script>", html, re.S)
    style = re.search(r"<style>(.*)</style>", html, re.S)
    assert script and style
    assert _sha(script[1]) in built.csp and _sha(style[1]) in built.csp
    assert 'rel="icon"' in html


def test_nothing_is_loaded_from_anywhere_but_the_page_itself() -> None:
    """No CDN, no absolute path: every file the page is made of, looked at for URLs."""
    static = resources.files("ktd.frontend.ui").joinpath("static")
    names = [p.name for p in static.iterdir()]
    assert set(page.SCRIPTS) | {"index.html", "style.css", "favicon.svg"} <= set(names)
    for name in names:
        text = static.joinpath(name).read_text()
        urls = re.findall(r"https?://[^\s\"'`)]+", text)
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (name, urls)
        # Absolute paths would break under a reverse proxy's prefix.
        assert not re.search(r"""(src|href|action)=["']/""", text), name
        assert 'fetch("/' not in text and 'EventSource("/' not in text, name


def test_sse_framing() -> None:
    assert wire.event("view", b'{"a":1}') == b'event: view\ndata: {"a":1}\n\n'
    with pytest.raises(ValueError):
        wire.event("x", b"two\nlines")
    assert wire.comment("a\nb") == b": a b\n\n"
    assert wire.retry(1500) == b"retry: 1500\n\n"
    assert b"\n" not in wire.encode({"s": "line\nbreak"})


def test_heartbeat_interval_follows_idle_timeout() -> None:
    assert ui.heartbeat_interval(15.0) == 7.5
    assert ui.heartbeat_interval(0.5) == 1.0
    assert ui.heartbeat_interval(600.0) == 15.0
