"""routes.py's table is written as lines of words (``_rows``): each word sets the field
it is a value of, and a word that is none is refused when the module loads."""

from __future__ import annotations

import pytest

from ktd.frontend.routes import TABLE, Route, _rows


def test_a_line_is_a_route() -> None:
    (row,) = _rows("proxy", "GET,HEAD /v1/x x none response remember ollama open", query=("a",))
    assert row == Route(
        "/v1/x",
        ("GET", "HEAD"),
        "proxy",
        "x",
        api="ollama",
        open=True,
        body="none",
        model="response",
        remember=True,
        query=("a",),
    )


def test_an_unknown_word_is_refused() -> None:
    with pytest.raises(ValueError, match="jsn"):
        _rows("proxy", "POST /v1/x x jsn required")


def test_every_path_and_method_once() -> None:
    pairs = [(r.path, m) for r in TABLE for m in r.methods]
    assert len(pairs) == len(set(pairs))
