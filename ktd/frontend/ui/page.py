"""The dashboard's one page: markup, style and script from the package, put together once.

Why one response with everything inline: the page works wherever it is mounted
(``/ui``, ``/ui/``, ``/prefix/ui`` behind a reverse proxy, a ``unix:`` bind) because
it loads nothing by URL but what its script computes from its own location, and
no CDN, no second request, no build step is involved: the files in ``static/`` are
what runs. The Content-Security-Policy names the exact inline style and script by
their hashes, so nothing else can run in the page, injected or not.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

SCRIPTS = (
    "util.js",
    "plots.js",
    "usage.js",
    "waiting.js",
    "pulls.js",
    "machine.js",
    "cards.js",
    "config.js",
    "app.js",
)


@dataclass(frozen=True)
class Page:
    html: bytes
    csp: str
    favicon: bytes


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def assemble(template: str, style: str, scripts: Sequence[str], favicon: str) -> Page:
    """The page from its parts (pure). ``template`` has ``{{style}}``, ``{{script}}``
    and ``{{favicon}}`` where they go."""
    script = "\n".join(scripts)
    if "</script" in script.lower() or "</style" in style.lower():
        raise ValueError("an inline part would end its own element")
    icon = "data:image/svg+xml;base64," + base64.b64encode(favicon.encode("utf-8")).decode()
    html = (
        template.replace("{{favicon}}", icon)
        .replace("{{style}}", style)
        .replace("{{script}}", script)
    )
    csp = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hash(script)}",
            f"style-src {_hash(style)}",
            "img-src data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return Page(html=html.encode("utf-8"), csp=csp, favicon=favicon.encode("utf-8"))


def load() -> Page:
    """The packaged page (``ktd/frontend/ui/static``)."""
    static = resources.files("ktd.frontend.ui").joinpath("static")

    def read(name: str) -> str:
        return static.joinpath(name).read_text(encoding="utf-8")

    return assemble(
        read("index.html"), read("style.css"), [read(n) for n in SCRIPTS], read("favicon.svg")
    )
