"""The editor's pure part: what a page is shown of models.json (its secrets marked by the
daemon, never sent), and how what it sends back becomes the text the daemon gets (issue
39, 43); and the editor's endpoints off without ``ui_control``."""

from __future__ import annotations

import json

import pytest

from ktd import protocol as p
from ktd.core import configtext, trust
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


def reply(text: str | None, *, redacted: bool = True) -> p.ConfigReply:
    """A ``config_get`` answer as the daemon gives it to the dashboard (``delegated``):
    its secrets marked (``ktd.core.trust.masked``)."""
    got = p.ConfigReply(
        version="abc", running="abc", models_path="/etc/models.json", models_text=text
    )
    return trust.masked(got) if redacted else got


def test_the_view_holds_no_secret_and_keeps_the_layout() -> None:
    view = ce.editor_view(reply(MODELS), p.ConfigHistoryReply(keep=21))
    shown = json.dumps(view)
    for secret in ("hf_one", "sk-two", "sk-three", "s4", "plain"):
        assert secret not in shown
    # Marked in place: the text is the file's, line for line (entry c's "K=V" string
    # needs its marks quoted: the whole document is dumped again).
    assert '"HF_TOKEN": "•••• secret #1 (unchanged)"' in view["models_text"]
    kt = view["entries"][1]["entry"]["kt"]
    assert kt["extra_args"] == "'--api-key=•••• secret #4 (unchanged)'"
    assert {f["name"] for f in view["fields"]} >= {"ttl", "kt.ctx", "kt.extra_env"}


def test_a_text_the_daemon_did_not_mark_is_never_shown() -> None:
    """An older daemon, or one that answered as to the owner: no text, no entries."""
    view = ce.editor_view(reply(MODELS, redacted=False), p.ConfigHistoryReply())
    assert view["models_text"] is None and view["entries"] == []
    assert "hf_one" not in json.dumps(view)


def test_marks_are_sent_on_for_the_daemon_to_put_back() -> None:
    view = ce.editor_view(reply(MODELS), p.ConfigHistoryReply())
    edited = view["models_text"].replace('"path": "/m/b"', '"path": "/m/bb"')
    assert ce.text_for({"models_text": edited}, view["models_text"]) == edited
    entry = dict(view["entries"][0]["entry"], ttl=30)
    out = ce.text_for({"alias": "a", "entry": entry}, view["models_text"])
    assert out == configtext.set_fields(view["models_text"], "a", {"ttl": 30})
    secrets = trust.secrets_of("{}", MODELS)
    assert json.loads(trust.unmasked(None, out, ("{}", MODELS))[1] or "") == json.loads(
        configtext.set_fields(MODELS, "a", {"ttl": 30})
    )
    assert secrets[0] == "hf_one"


def test_a_change_that_is_not_one_is_refused() -> None:
    with pytest.raises(ce.ChangeError, match="expected models_text, or alias and entry"):
        ce.text_for({"alias": "a"}, MODELS)
    with pytest.raises(ce.ChangeError, match="no entry with alias 'zz'"):
        ce.text_for({"alias": "zz", "entry": {}}, MODELS)


def test_a_text_that_does_not_parse_is_not_shown() -> None:
    got = p.ConfigReply(version="v", models_text='[{"alias": "a", "kt": {"extra_env": {"H": "x"')
    view = ce.editor_view(trust.masked(got), p.ConfigHistoryReply())
    assert view["models_text"] is None and '"x"' not in json.dumps(view)


async def test_the_editor_is_off_without_ui_control(start_frontend: StartFrontend) -> None:
    fe = await start_frontend()
    page = {"X-Ktd-UI": "1"}
    async with fe.client(headers=page) as c:
        r = await c.get("/ui/api/config")
        assert r.status_code == 403 and "ui_control" in r.json()["error"]["message"]
        r = await c.post("/ui/api/config/apply", json={"base": "abc", "models_text": "[]"})
        assert r.status_code == 403
