"""The editor's pure part: what a page is shown of models.json (its secrets marked, never
sent), and how what it sends back becomes the file's text again (issue 39); and the
editor's endpoints off without ``ui_control``."""

from __future__ import annotations

import json

import pytest

from ktd import protocol as p
from ktd.core import configtext
from ktd.frontend.ui import configedit as ce
from tests.frontend.frontend_helpers import StartFrontend

MODELS = json.dumps(
    [
        {
            "path": "/m/a",
            "backend": "kt",
            "alias": "a",
            "kt": {
                "extra_env": {"HF_TOKEN": "hf_one", "OTHER": "plain"},
                "extra_args": ["--api-key", "sk-two", "--tp", "2"],
            },
        },
        {"path": "/m/b", "backend": "kt", "alias": "b", "kt": {"extra_args": "--api-key=sk-three"}},
        {"path": "/m/c", "backend": "kt", "alias": "c", "kt": {"extra_env": "SECRET_X=s4 A=1"}},
    ],
    indent=2,
)


def reply(text: str | None) -> p.ConfigReply:
    return p.ConfigReply(
        version="abc", running="abc", models_path="/etc/models.json", models_text=text
    )


def test_every_kind_of_secret_is_found_once() -> None:
    assert ce.secrets_of(configtext.entries(MODELS)) == ["hf_one", "sk-two", "sk-three", "s4"]


def test_the_view_holds_no_secret_and_keeps_the_layout() -> None:
    view = ce.editor_view(reply(MODELS), p.ConfigHistoryReply(keep=21))
    shown = json.dumps(view)
    for secret in ("hf_one", "sk-two", "sk-three", "s4"):
        assert secret not in shown
    # Marked in place: the text is the file's, line for line.
    assert view["models_text"].count("\n") == MODELS.count("\n")
    assert '"HF_TOKEN": "•••• secret #1 (unchanged)"' in view["models_text"]
    assert view["entries"][1]["entry"]["kt"]["extra_args"] == "--api-key=•••• secret #3 (unchanged)"
    assert {f["name"] for f in view["fields"]} >= {"ttl", "kt.ctx", "kt.extra_env"}


def test_marks_come_back_as_their_secrets() -> None:
    view = ce.editor_view(reply(MODELS), p.ConfigHistoryReply())
    # The raw view, with one value changed by the user: the file, that value changed.
    edited = view["models_text"].replace('"path": "/m/b"', '"path": "/m/bb"')
    assert ce.text_for({"models_text": edited}, MODELS) == MODELS.replace('"/m/b"', '"/m/bb"')
    # The form: one entry, its marks as they were shown.
    entry = dict(view["entries"][0]["entry"], ttl=30)
    out = ce.text_for({"alias": "a", "entry": entry}, MODELS)
    assert out == configtext.set_fields(MODELS, "a", {"ttl": 30})


def test_a_mark_of_no_secret_is_refused_not_written() -> None:
    with pytest.raises(ce.ChangeError, match="secret #9: there is no such secret"):
        ce.text_for({"models_text": '[{"x": "•••• secret #9 (unchanged)"}]'}, MODELS)
    escaped = '[{"alias": "a", "k": "\\u2022\\u2022\\u2022\\u2022 secret #1 (unchanged)"}]'
    assert json.loads(ce.text_for({"models_text": escaped}, MODELS))[0]["k"] == "hf_one"
    with pytest.raises(ce.ChangeError, match="expected models_text, or alias and entry"):
        ce.text_for({"alias": "a"}, MODELS)
    with pytest.raises(ce.ChangeError, match="no entry with alias 'zz'"):
        ce.text_for({"alias": "zz", "entry": {}}, MODELS)


def test_a_secret_spelled_otherwise_is_still_never_shown() -> None:
    # JSON may spell a value with escapes: the text cannot be searched for it, so the
    # view is the document dumped again (layout lost in the view only).
    text = '[{"alias": "a", "kt": {"extra_env": {"API_KEY": "\\u0073k-esc"}}}]'
    view = ce.editor_view(reply(text), p.ConfigHistoryReply())
    assert "sk-esc" not in view["models_text"] and "\\u0073k-esc" not in view["models_text"]
    assert "secret #1" in view["models_text"]


def test_a_text_that_does_not_parse_is_not_shown() -> None:
    view = ce.editor_view(
        reply('[{"alias": "a", "kt": {"extra_env": {"HF_TOKEN": "x"'), p.ConfigHistoryReply()
    )
    assert view["models_text"] is None and "not valid JSON" in view["problem"]


def test_a_plan_shown_has_its_secrets_marked() -> None:
    plan = p.ConfigPlanView(
        base="a",
        version="b",
        engines=[
            p.EnginePlan(
                alias="a",
                action="restart",
                fields=[
                    p.FieldChange(
                        field="kt.extra_env", old={"HF_TOKEN": "hf_one"}, new={"HF_TOKEN": "hf_new"}
                    )
                ],
            )
        ],
    )
    new = MODELS.replace("hf_one", "hf_new")
    shown = json.dumps(ce.shown_plan(plan, MODELS, new))
    assert "hf_one" not in shown and "hf_new" not in shown


async def test_the_editor_is_off_without_ui_control(start_frontend: StartFrontend) -> None:
    fe = await start_frontend()
    page = {"X-Ktd-UI": "1"}
    async with fe.client(headers=page) as c:
        r = await c.get("/ui/api/config")
        assert r.status_code == 403 and "ui_control" in r.json()["error"]["message"]
        r = await c.post("/ui/api/config/apply", json={"base": "abc", "models_text": "[]"})
        assert r.status_code == 403
