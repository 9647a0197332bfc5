"""Secrets chosen by the marks on the config's types (issue 43): found in every form a
field takes, marked in a text (in its layout when that is sure), and put back only where
a secret stands."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ktd.core import secret as s
from ktd.core.config import ConfigFile, DaemonSection, FrontendSection, ModelEntry
from tests.hypo import budget

MODELS = json.dumps(
    [
        {
            "path": "/m/a",
            "backend": "kt",
            "alias": "a",
            "kt": {
                "extra_env": {"HF_TOKEN": "hf_one", "KTD_SIM_TOKEN_RATE": "5"},
                "extra_args": ["--api-key", "sk-two", "--tp", "2"],
            },
        },
        {
            "path": "/m/b",
            "backend": "kt",
            "alias": "b",
            "kt": {"extra_args": "--admin-api-key=sk-3"},
        },
        {"path": "/m/c", "backend": "kt", "alias": "c", "kt": {"extra_env": "X_SECRET=s4 A=one"}},
    ],
    indent=2,
)
ENTRIES = list[ModelEntry]

CONFIG = {
    "frontend": {
        "api_keys": ["sk-plain"],
        "keys": [
            {"name": "ops", "key": "sk-named", "admin": True},
            {"name": "h", "key_sha256": "0" * 64},
        ],
    },
    "gateway": {"api_key": "gw-1", "worker_api_key": "gw-2", "labels": {"token": "not-a-secret"}},
    "ktransformers": {
        "extra_env": ["HOME_TOKEN=e1"],
        "extra_args": "--ssl-keyfile-password pw --tp 2",
    },
}


def test_every_marked_field_is_found_in_each_of_its_forms_and_nothing_by_name() -> None:
    assert s.found(json.loads(MODELS), ENTRIES) == ["hf_one", "5", "sk-two", "sk-3", "s4", "one"]
    found = s.found(CONFIG, ConfigFile)
    assert found == ["sk-plain", "sk-named", "gw-1", "gw-2", "e1", "pw"]
    # A label named "token" is no secret field; a digest is not the secret.
    assert "not-a-secret" not in found and "0" * 64 not in found


def test_which_fields_hold_a_secret_is_read_off_the_types() -> None:
    hints = s.hints(FrontendSection)
    assert s.holds_secret(hints["api_keys"]) and s.holds_secret(hints["keys"])
    assert not s.holds_secret(hints["allowed_origins"])
    assert not any(s.holds_secret(t) for t in s.hints(DaemonSection).values())


def test_a_text_is_marked_in_its_own_layout_and_comes_back_whole() -> None:
    secrets = s.found(json.loads(MODELS), ENTRIES)
    masked = s.mask_text(MODELS, ENTRIES, secrets)
    assert masked is not None
    for value in ("hf_one", "sk-two", "sk-3", "s4"):
        assert value not in masked
    assert '"HF_TOKEN": "\u2022\u2022\u2022\u2022 secret #1 (unchanged)"' in masked
    back = s.unmask_text(masked, ENTRIES, secrets)
    assert json.loads(back) == json.loads(MODELS)
    # Without a shell-like string (a mark in one needs quoting): marked in place, line for
    # line; the others are the document dumped again, never the secret.
    two = json.dumps(json.loads(MODELS)[:1], indent=2)
    masked = s.mask_text(two, ENTRIES, secrets)
    assert masked is not None and masked.count("\n") == two.count("\n")
    assert '"path": "/m/a"' in masked and "sk-two" not in masked  # "5": whole strings only
    assert s.unmask_text(masked, ENTRIES, secrets) == two


def test_a_short_secret_never_marks_other_text() -> None:
    text = json.dumps([{"alias": "m1", "path": "/m/1", "backend": "kt", "ttl": 1,
                        "kt": {"extra_env": {"CUDA_LAUNCH_BLOCKING": "1"}}}])  # fmt: skip
    masked = s.mask_text(text, ENTRIES, ["1"])
    assert masked is not None
    doc = json.loads(masked)[0]
    assert (doc["alias"], doc["path"], doc["ttl"]) == ("m1", "/m/1", 1)
    assert doc["kt"]["extra_env"]["CUDA_LAUNCH_BLOCKING"] == s.MARK.format(1)


def test_a_mark_goes_back_only_where_a_secret_stands() -> None:
    secrets = ["hf_one"]
    sent = json.dumps([{"alias": s.MARK.format(1), "path": "/m",
                        "kt": {"extra_env": {"HF_TOKEN": s.MARK.format(1)}}}])  # fmt: skip
    doc = json.loads(s.unmask_text(sent, ENTRIES, secrets))[0]
    assert doc["kt"]["extra_env"]["HF_TOKEN"] == "hf_one"
    assert doc["alias"] == s.MARK.format(1)  # a name, not a place for a secret: as sent
    with pytest.raises(s.MarkError, match="secret #9: there is no such secret"):
        s.unmask_text(
            json.dumps([{"kt": {"extra_env": {"X": s.MARK.format(9)}}}]), ENTRIES, secrets
        )


def test_shell_forms_keep_their_words() -> None:
    doc = {"ktransformers": {"extra_env": "A='x y' B=z", "extra_args": "--api-key=k --tp 2"}}
    out = s.redact(doc, ConfigFile, lambda v, at: s.HIDDEN)["ktransformers"]
    assert out == {
        "extra_env": "'A=(hidden)' 'B=(hidden)'",
        "extra_args": "'--api-key=(hidden)' --tp 2",
    }
    unclosed = {"ktransformers": {"extra_env": "A='unclosed"}}
    assert s.redact(unclosed, ConfigFile, lambda v, at: "?") == {
        "ktransformers": {"extra_env": "?"}  # no words to read: all of it
    }


def test_a_text_that_is_no_json_cannot_be_marked() -> None:
    assert s.mask_text('[{"alias": "a"', ENTRIES, []) is None


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)


@st.composite
def _models(draw: st.DrawFn) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(draw(st.integers(1, 3))):
        env = draw(st.dictionaries(_NAME, _TEXT, max_size=4))
        args = draw(
            st.lists(
                st.sampled_from(["--tp", "2", "--api-key", "--admin-api-key"]) | _TEXT, max_size=5
            )
        )
        kt: dict[str, object] = {"extra_env": env, "extra_args": args}
        if draw(st.booleans()):  # the shell-like forms
            kt = {"extra_env": [f"{k}={v}" for k, v in env.items()], "extra_args": args}
        out.append({"alias": f"m{i}", "path": draw(_TEXT), "backend": "kt", "kt": kt})
    return out


@budget(200)
@given(models=_models(), indent=st.sampled_from([None, 2]))
def test_marked_then_given_back_a_text_is_what_it_was_and_shows_no_secret(
    models: list[dict[str, object]], indent: int | None
) -> None:
    """Any models.json: the marked text holds no secret where a secret stands, and the
    marks given back make the same document (a secret is never lost nor moved)."""
    text = json.dumps(models, indent=indent)
    secrets = s.found(models, ENTRIES)
    masked = s.mask_text(text, ENTRIES, secrets)
    assert masked is not None
    left: list[str] = s.found(json.loads(masked), ENTRIES)
    assert not set(left) & set(secrets)
    assert json.loads(s.unmask_text(masked, ENTRIES, secrets)) == models
