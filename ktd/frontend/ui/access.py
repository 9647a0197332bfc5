"""Who may see the dashboard and use its buttons, and how a browser proves it. Pure.

The rules (docs/ui.md): without keys (``frontend.api_keys``, ``frontend.keys``) the
dashboard is open, as the API is. With keys, nothing but the page itself (markup and
script, no data) reaches a browser that has not shown one: as ``Authorization:
Bearer KEY`` (scripts), or as the session cookie that ``POST ui/api/login`` sets
after the form (or a ``ui?token=KEY`` link, which the page turns into that login)
showed a key.

The cookie is not the key: it is an HMAC of a fixed label under the key's SHA-256
(a ``key_sha256`` in the config is enough to check it), so it opens
the dashboard while that key is configured (a frontend restart keeps it valid, and
the live view reconnects without asking again), dies with the key, and is no use as
a Bearer key against the API. It is ``HttpOnly`` (no script reads it) and
``SameSite=Strict`` (no other site's page sends it), and the buttons also want a
header no cross-site form can add (``X-Ktd-UI``), so a forged request has neither;
and they are only for an ``admin`` key (every plain ``api_keys`` key is one).
No ``Path``: the browser scopes it to the login URL's directory, ``.../ui/api``
whatever prefix a reverse proxy adds, so it goes to the dashboard's data and to
nothing else of the frontend.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

from ktd.core.keys import KeyRing, Policy, bearer

COOKIE = "ktd_ui"
CONTROL_HEADER = b"x-ktd-ui"
COOKIE_MAX_AGE = 7 * 24 * 3600
_LABEL = b"ktd-ui-session-v1"


def cookie_value(key: str) -> str:
    """The session cookie a browser holds for ``key``."""
    return _cookie_of(hashlib.sha256(key.encode("utf-8")).digest())


def _cookie_of(digest: bytes) -> str:
    return hmac.new(digest, _LABEL, hashlib.sha256).hexdigest()


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


def _find(given: bytes, candidates: Sequence[tuple[bytes, Policy]]) -> Policy | None:
    found = None
    for candidate, policy in candidates:
        # Every candidate is compared, so timing does not tell which one is close.
        if hmac.compare_digest(given, candidate):
            found = policy
    return found


class Access:
    """The dashboard's access decisions for one frontend's keys and ``ui_control``."""

    def __init__(self, ring: KeyRing, *, control: bool) -> None:
        self._ring = ring
        self._cookies = [(_cookie_of(d).encode("ascii"), p) for d, p in ring.digests]
        self.required = ring.enabled
        # Config validation refuses ui_control without keys; this holds whatever the caller.
        self.control = control and self.required

    def key_ok(self, key: str) -> bool:
        return self.who(f"Bearer {key}".encode(), []) is not None

    def who(self, authorization: bytes | None, cookies: Iterable[bytes]) -> Policy | None:
        """The key this request showed (in the header, or as a good session cookie)."""
        token = bearer(authorization)
        if token is not None:
            found = self._ring.find(token)
            if found is not None:
                return found
        for value in parse_cookies(cookies).get(COOKIE, []):
            found = _find(value.encode("latin-1"), self._cookies)
            if found is not None:
                return found
        return None

    def allowed(self, authorization: bytes | None, cookies: Iterable[bytes]) -> bool:
        """May this request see data?"""
        return not self.required or self.who(authorization, cookies) is not None

    def may_act(self, who: Policy | None, control_header: bytes | None) -> bool:
        """Buttons: ``ui_control`` on, an admin key shown, and the page's own header."""
        return self.control and who is not None and who.admin and control_header == b"1"
