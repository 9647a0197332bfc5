"""Where ktd's files live (``ktd.paths``): an env override, else root's system path,
else one under the user's home."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktd import paths


@pytest.fixture
def as_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "_is_root", lambda: False)


@pytest.fixture
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "_is_root", lambda: True)


def test_placed_the_variable_wins_over_root_and_home(as_root: None) -> None:
    env = {"KTD_X": "/somewhere/x", "HOME": "/home/u"}
    assert paths._placed(env, "KTD_X", "/etc/x", ".x") == Path("/somewhere/x")


def test_placed_an_empty_variable_does_not_count(as_root: None) -> None:
    assert paths._placed({"KTD_X": ""}, "KTD_X", "/etc/x", ".x") == Path("/etc/x")


def test_placed_a_user_gets_the_place_under_home(as_user: None) -> None:
    assert paths._placed({"HOME": "/home/u"}, "KTD_X", "/etc/x", ".x/y") == Path("/home/u/.x/y")


def test_placed_without_home_is_under_the_tilde_expanded(as_user: None) -> None:
    got = paths._placed({}, "KTD_X", "/etc/x", ".x")
    assert got == Path("~").expanduser() / ".x"


def test_config_and_state_for_root(as_root: None) -> None:
    assert paths.default_config_path({}) == Path("/etc/ktd/config.json")
    assert paths.state_dir({}) == Path("/var/lib/ktd")


def test_config_and_state_for_a_user(as_user: None) -> None:
    env = {"HOME": "/home/u"}
    assert paths.default_config_path(env) == Path("/home/u/.config/ktd/config.json")
    assert paths.state_dir(env) == Path("/home/u/.local/state/ktd")


def test_config_and_state_overridden(as_user: None) -> None:
    env = {"KTD_CONFIG": "/c.json", "KTD_STATE_DIR": "/s", "HOME": "/home/u"}
    assert paths.default_config_path(env) == Path("/c.json")
    assert paths.state_dir(env) == Path("/s")
