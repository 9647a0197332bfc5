"""The dashboard's access rules, pure: keys, the session cookie, who may press buttons."""

from __future__ import annotations

import hashlib

from ktd.core.config import KeyEntry
from ktd.core.keys import KeyRing
from ktd.frontend.ui.access import (
    COOKIE,
    Access,
    cookie_value,
    parse_cookies,
    set_cookie,
)

KEY = "sk-dash-1"
OTHER = "sk-dash-2"


def cookie_header(value: str, *more: str) -> list[bytes]:
    return ["; ".join([f"{COOKIE}={value}", *more]).encode()]


def test_without_keys_everything_is_open_and_nothing_is_pressable() -> None:
    open_ = Access(KeyRing(), control=True)  # config validation refuses this; it holds anyway
    assert not open_.required
    assert open_.allowed(None, [])
    assert not open_.control
    assert not open_.may_act(None, b"1")


def test_the_cookie_is_derived_from_the_key_and_is_not_the_key() -> None:
    value = cookie_value(KEY)
    assert value == cookie_value(KEY)  # stable: a frontend restart keeps sessions
    assert KEY not in value and value != cookie_value(OTHER)
    assert len(value) == 64 and int(value, 16) >= 0


def test_a_key_opens_as_bearer_or_as_its_cookie() -> None:
    access = Access(KeyRing([KEY, OTHER]), control=False)
    assert access.required
    assert not access.allowed(None, [])
    assert access.allowed(f"Bearer {KEY}".encode(), [])
    assert access.allowed(f"bearer  {OTHER} ".encode(), [])
    assert not access.allowed(b"Bearer nope", [])
    assert not access.allowed(f"Basic {KEY}".encode(), [])
    assert access.allowed(None, cookie_header(cookie_value(OTHER)))
    # The raw key is no cookie, and neither is another label's HMAC.
    assert not access.allowed(None, cookie_header(KEY))
    assert not access.allowed(None, [f"other={cookie_value(KEY)}".encode()])
    # A stale cookie beside a good one (two paths) still opens.
    assert access.allowed(None, cookie_header("stale", f"{COOKIE}={cookie_value(KEY)}"))
    assert access.key_ok(KEY) and not access.key_ok("") and not access.key_ok(KEY + "x")


def test_non_ascii_never_raises() -> None:
    access = Access(KeyRing([KEY]), control=False)
    assert not access.allowed("Bearer ключ".encode(), ["ktd_ui=ключ".encode()])
    assert not access.key_ok("ключ")


def test_buttons_need_control_an_admin_key_and_the_pages_own_header() -> None:
    ring = KeyRing([KEY], [KeyEntry(name="viewer", key=OTHER)])
    access = Access(ring, control=True)
    admin = access.who(f"Bearer {KEY}".encode(), [])
    viewer = access.who(None, cookie_header(cookie_value(OTHER)))
    assert access.control and admin is not None and viewer is not None
    assert access.may_act(admin, b"1")
    assert not access.may_act(None, b"1")
    assert not access.may_act(viewer, b"1")  # a named key without admin: it may look
    assert not access.may_act(admin, None)  # a cross-site form cannot add the header
    assert not Access(ring, control=False).may_act(admin, b"1")


def test_a_key_given_as_its_sha256_opens_with_its_cookie() -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    access = Access(KeyRing([], [KeyEntry(name="ops", key_sha256=digest)]), control=False)
    assert access.allowed(None, cookie_header(cookie_value(KEY)))
    assert access.key_ok(KEY) and not access.key_ok(digest)


def test_set_cookie_attributes() -> None:
    plain = set_cookie("abc", secure=False)
    parts = plain.split("; ")
    assert parts[0] == f"{COOKIE}=abc"
    assert "HttpOnly" in parts and "SameSite=Strict" in parts
    assert not any(p.startswith("Path=") for p in parts)  # scoped to the login URL's dir
    assert "Secure" not in parts
    assert "Secure" in set_cookie("abc", secure=True).split("; ")
    assert "Max-Age=0" in set_cookie("", secure=False, max_age=0).split("; ")


def test_parse_cookies() -> None:
    got = parse_cookies([b'a=1; b="2"', b"a=3;;  junk; =x; c="])
    assert got == {"a": ["1", "3"], "b": ["2"], "c": [""]}
