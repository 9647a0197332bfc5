"""Who may see the dashboard and use its buttons, and how a browser proves it. Pure.

The rules (docs/ui.md): without ``frontend.api_keys`` the dashboard is open, as the
API is. With keys, nothing but the page itself (markup and script, no data) reaches
a browser that has not shown one: as ``Authorization: Bearer KEY`` (scripts), or as
the session cookie that ``POST ui/api/login`` sets after the form (or a
``ui?token=KEY`` link, which the page turns into that login) showed a key.

The cookie is not the key: it is an HMAC of a fixed label under the key, so it opens
the dashboard while that key is configured (a frontend restart keeps it valid, and
the live view reconnects without asking again), dies with the key, and is no use as
a Bearer key against the API. It is ``HttpOnly`` (no script reads it) and
``SameSite=Strict`` (no other site's page sends it), and the buttons also want a
header no cross-site form can add (``X-Ktd-UI``), so a forged request has neither.
No ``Path``: the browser scopes it to the login URL's directory, ``.../ui/api``
whatever prefix a reverse proxy adds, so it goes to the dashboard's data and to
nothing else of the frontend.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

COOKIE = "ktd_ui"
CONTROL_HEADER = b"x-ktd-ui"
COOKIE_MAX_AGE = 7 * 24 * 3600
_LABEL = b"ktd-ui-session-v1"


def cookie_value(key: str) -> str:
    """The session cookie a browser holds for ``key``."""
    return hmac.new(key.encode("utf-8"), _LABEL, hashlib.sha256).hexdigest()


def parse_cookies(headers: Iterable[bytes]) -> dict[str, list[str]]:
    """Every ``name=value`` of the ``Cookie`` headers; a name may come more than once."""
    out: dict[str, list[str]] = {}
    for header in headers:
        for part in header.decode("latin-1").split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name:
                out.setdefault(name, []).append(value.strip().strip('"'))
    return out


def set_cookie(value: str, *, secure: bool, max_age: int = COOKIE_MAX_AGE) -> str:
    """A ``Set-Cookie`` value; ``max_age=0`` deletes the cookie."""
    parts = [f"{COOKIE}={value}", "HttpOnly", "SameSite=Strict", f"Max-Age={max_age}"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def _any_equal(given: bytes, candidates: Sequence[bytes]) -> bool:
    ok = False
    for candidate in candidates:
        # Every candidate is compared, so timing does not tell which one is close.
        ok |= hmac.compare_digest(given, candidate)
    return ok


class Access:
    """The dashboard's access decisions for one frontend's ``api_keys`` and ``ui_control``."""

    def __init__(self, keys: Sequence[str], *, control: bool) -> None:
        self._keys = [k.encode("utf-8") for k in keys]
        self._cookies = [cookie_value(k).encode("ascii") for k in keys]
        self.required = bool(keys)
        # Config validation refuses ui_control without keys; this holds whatever the caller.
        self.control = control and self.required

    def key_ok(self, key: str) -> bool:
        return bool(key) and _any_equal(key.encode("utf-8"), self._keys)

    def allowed(self, authorization: bytes | None, cookies: Iterable[bytes]) -> bool:
        """May this request see data? (A key in the header, or a good session cookie.)"""
        if not self.required:
            return True
        if authorization:
            scheme, _, token = authorization.strip().partition(b" ")
            if scheme.lower() == b"bearer" and _any_equal(token.strip(), self._keys):
                return True
        for value in parse_cookies(cookies).get(COOKIE, []):
            if _any_equal(value.encode("latin-1"), self._cookies):
                return True
        return False

    def may_act(self, allowed: bool, control_header: bytes | None) -> bool:
        """Buttons: ``ui_control`` on, a key shown, and the page's own header present."""
        return self.control and allowed and control_header == b"1"
