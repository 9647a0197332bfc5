"""The key ring: which policy a token is, what it may use; the config's checks of keys."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ktd.core.config import ConfigError, KeyEntry
from ktd.core.configload import load_config
from ktd.core.keys import KeyRing, plain_name


def test_plain_and_named_keys_are_found_by_their_secret() -> None:
    ring = KeyRing(
        ["plain-secret"],
        [
            KeyEntry(name="alice", key="a-secret", models=["qwen*"], max_concurrent=2),
            KeyEntry(name="bob", key_sha256=hashlib.sha256(b"b-secret").hexdigest(), priority=3),
        ],
    )
    assert ring.enabled
    plain = ring.find(b"plain-secret")
    assert plain is not None and plain.name == plain_name("plain-secret") and plain.admin
    assert plain.allows("anything")
    alice = ring.find(b"a-secret")
    assert alice is not None and alice.terms.max_concurrent == 2 and not alice.admin
    assert alice.allows("qwen3-moe") and not alice.allows("deepseek-v4-kt")
    assert alice.visible(["deepseek-v4-kt", "qwen3-moe"]) == ["qwen3-moe"]
    bob = ring.find(b"b-secret")
    assert bob is not None and bob.terms.priority == 3
    assert ring.find(b"nobody") is None and ring.find(b"") is None
    assert not KeyRing().enabled


def test_a_plain_key_s_name_says_nothing_of_its_secret_and_stays_put() -> None:
    name = plain_name("s3cret")
    assert name.startswith("key-") and "s3cret" not in name and len(name) == 12
    assert KeyRing(["x", "s3cret"]).find(b"s3cret").name == name  # type: ignore[union-attr]


def test_patterns_that_match_no_model_are_reported_not_refused() -> None:
    ring = KeyRing([], [KeyEntry(name="a", key="k", models=["gone-model", "qwen*"])])
    assert ring.unknown_models(["qwen3"]) == ["a: gone-model"]


def _load(tmp_path: Path, keys: object, **frontend: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"frontend": {"keys": keys, **frontend}}))
    load_config(path)


@pytest.mark.parametrize(
    ("keys", "field", "words"),
    [
        ([{"name": "a b", "key": "k"}], "$.frontend.keys[0].name", "A-Z"),
        ([{"name": "a", "key": "k"}, {"name": "a", "key": "j"}], "keys[1].name", "two keys"),
        ([{"name": "a"}], "$.frontend.keys[0]", "exactly one of key and key_sha256"),
        ([{"name": "a", "key": "k", "key_sha256": "0" * 64}], "keys[0]", "exactly one"),
        ([{"name": "a", "key_sha256": "XYZ"}], "keys[0].key_sha256", "64 lowercase hex"),
        ([{"name": "a", "key": "k"}, {"name": "b", "key": "k"}], "keys[1]", "another key's"),
        ([{"name": "a", "key": "k", "models": []}], "keys[0].models", "patterns"),
        ([{"name": "a", "key": "k", "max_concurrent": 0}], "keys[0].max_concurrent", ">= 1"),
        ([{"name": "a", "key": "k", "tokens_per_day": -5}], "keys[0].tokens_per_day", ">= 1"),
        ([{"name": "a", "key": "k", "priority": 10**6}], "keys[0].priority", "-1000..1000"),
        ([{"name": "a", "key": "k", "progress": "think"}], "keys[0].progress", "Invalid enum"),
    ],
)
def test_bad_keys_are_named_by_file_and_field(
    tmp_path: Path, keys: object, field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, keys)
    assert field in str(info.value) and words in str(info.value)
    assert "config.json" in str(info.value)


def test_a_named_key_may_not_reuse_a_plain_key_s_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="another key's"):
        _load(tmp_path, [{"name": "a", "key": "same"}], api_keys=["same"])


def test_ui_control_is_for_an_admin_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ui_control"):
        _load(tmp_path, [{"name": "a", "key": "k"}], ui_control=True)
    _load(tmp_path, [{"name": "a", "key": "k", "admin": True}], ui_control=True)
