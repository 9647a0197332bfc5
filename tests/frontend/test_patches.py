"""The HTTP stack's patches: installed only on the release lines they were checked on."""

from __future__ import annotations

from importlib import metadata

import pytest

from ktd.frontend import patches


def test_the_installed_stack_is_one_the_patches_were_checked_on() -> None:
    assert patches.problems() == []
    for dist, (lines, _) in patches.CHECKED.items():
        assert patches.line_of(metadata.version(dist)) in lines


def test_another_release_line_is_named_with_what_the_patches_touch() -> None:
    installed = {"hypercorn": "0.19.1", "h11": "0.16.0", "quart-trio": "0.12.0"}
    [problem] = patches.problems(installed)
    assert problem.startswith("hypercorn 0.19.1 (ktd's patches were checked on 0.18.x")
    assert "protocol_send" in problem
    missing = patches.problems({"h11": "0.16.0", "quart-trio": "0.12.0"})
    assert missing == ["hypercorn is not installed"]


def test_install_refuses_before_touching_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version

    def version(dist: str) -> str:
        return "0.17.2" if dist == "h11" else real(dist)

    touched: list[str] = []
    monkeypatch.setattr(patches.metadata, "version", version)
    monkeypatch.setattr(patches.transport, "install", lambda *a: touched.append("transport"))
    monkeypatch.setattr(patches.intake, "install", lambda: touched.append("intake"))
    with pytest.raises(patches.UncheckedVersion, match=r"h11 0\.17\.2 .*ChunkedWriter"):
        patches.install()
    assert touched == []
    monkeypatch.setattr(patches.metadata, "version", real)
    patches.install(5.0)
    assert touched == ["transport", "intake"]
