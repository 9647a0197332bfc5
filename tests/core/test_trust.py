"""Who may change the config and what needs ktd's owner (issue 43, docs/security.md):
the roles from the socket's uid, and an admin's limits, pure."""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import pytest

from ktd import protocol as p
from ktd.core import secret, trust
from ktd.core.config import Config
from ktd.core.configload import ConfigTexts, parse_config
from ktd.core.trust import Role

OWNER = 1234


def config(models: list[dict[str, Any]], **cfg: Any) -> Config:
    texts = ConfigTexts(
        "/etc/ktd/config.json",
        json.dumps(cfg).encode(),
        "/etc/ktd/models.json",
        json.dumps(models).encode(),
    )
    return parse_config(texts)


def entry(alias: str, **kt: Any) -> dict[str, Any]:
    return {"path": f"/m/{alias}", "backend": "kt", "alias": alias, "kt": kt}


def test_roles_come_from_the_uid_and_delegation_only_lowers() -> None:
    def role(uid: int | None, name: str | None = None, **kw: Any) -> Role:
        return trust.role_of(uid, owner=OWNER, admins=["ops", 2000], name=name, **kw)

    assert role(OWNER) is role(0) is role(None) is Role.OWNER
    assert role(2000) is role(3000, "ops") is Role.ADMIN
    assert role(3000, "eve") is role(-1) is Role.MEMBER
    assert role(OWNER, delegated=True) is Role.ADMIN  # the dashboard, for an admin key
    assert role(3000, "eve", delegated=True) is Role.MEMBER


def test_a_new_interpreter_needs_the_owner_unless_listed_or_already_running() -> None:
    running = config(
        [entry("a", python="/opt/venv/bin/python")], daemon={"pythons": ["/usr/bin/py"]}
    )
    ok = config(
        [
            entry("a", python="/opt/venv/bin/python"),
            entry("b", python="/opt/venv/bin/python"),  # another engine's
            entry("c", python="/usr/bin/py"),  # in daemon.pythons
            entry("d"),  # the default one
        ],
        daemon={"pythons": ["/usr/bin/py"]},
    )
    assert trust.limits(running, ok, config_changed=False) == []
    bad = config([entry("a", python="/tmp/evil")])
    problems = trust.limits(running, bad, config_changed=False)
    assert [(q.code, q.file, q.path, q.alias) for q in problems] == [
        (p.ErrorCode.FORBIDDEN, "/etc/ktd/models.json", "$[0].kt.python", "a")
    ]
    assert "/tmp/evil" in problems[0].message
    assert sys.executable in trust.allowed_pythons(running)


def test_a_loader_variable_needs_the_owner_unless_the_model_already_has_it() -> None:
    running = config(
        [entry("a", extra_env={"LD_LIBRARY_PATH": "/opt/lib"})],
        ktransformers={"extra_env": {"PYTHONPATH": "/opt/shim"}},
    )
    same = config(
        [entry("a", extra_env={"LD_LIBRARY_PATH": "/opt/lib", "HF_TOKEN": "x"}), entry("b")],
        ktransformers={"extra_env": {"PYTHONPATH": "/opt/shim"}},
    )
    assert trust.limits(running, same, config_changed=False) == []
    changed = config(
        [
            entry("a", extra_env={"LD_LIBRARY_PATH": "/tmp/evil"}),
            entry("b", extra_env={"LD_PRELOAD": "/tmp/evil.so", "NODE_OPTIONS": "-r x", "A": "1"}),
        ],
        ktransformers={"extra_env": {"PYTHONPATH": "/opt/shim"}},
    )
    paths = [q.path for q in trust.limits(running, changed, config_changed=False)]
    assert paths == [
        "$[0].kt.extra_env.LD_LIBRARY_PATH",
        "$[1].kt.extra_env.LD_PRELOAD",
        "$[1].kt.extra_env.NODE_OPTIONS",
    ]


def test_the_loader_list_is_one_list() -> None:
    for name in ("LD_PRELOAD", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PYTHONSTARTUP",
                 "PERL5OPT", "BASH_ENV", "ENV", "GCONV_PATH", "PATH", "HOME", "TRITON_CACHE_DIR",
                 "SGLANG_EXTERNAL_MODEL_PACKAGE"):  # fmt: skip
        assert trust.is_loader(name), name
    for name in ("HF_TOKEN", "CUDA_VISIBLE_DEVICES", "KTD_SIM_TOKEN_RATE", "OMP_NUM_THREADS"):
        assert not trust.is_loader(name), name


def test_config_json_is_the_owners() -> None:
    running = config([])
    problems = trust.limits(running, running, config_changed=True)
    assert [(q.code, q.file) for q in problems] == [(p.ErrorCode.FORBIDDEN, "/etc/ktd/config.json")]


def test_a_non_owner_sees_the_config_with_every_secret_marked() -> None:
    cfg = json.dumps({"frontend": {"keys": [{"name": "ops", "key": "sk-ops", "admin": True}]},
                      "gateway": {"api_key": "gw-secret"}}, indent=2)  # fmt: skip
    models = json.dumps([entry("a", extra_env={"HF_TOKEN": "hf-1"})])
    got = trust.masked(p.ConfigReply(version="v", config_text=cfg, models_text=models))
    shown = got.config_text + (got.models_text or "")
    assert got.redacted and all(s not in shown for s in ("sk-ops", "gw-secret", "hf-1"))
    assert '"name": "ops"' in got.config_text  # the rest as it is
    config_back, models_back = trust.unmasked(got.config_text, got.models_text, (cfg, models))
    assert config_back == cfg and json.loads(models_back or "") == json.loads(models)
    broken = trust.masked(p.ConfigReply(version="v", config_text='{"gateway": {"api_key": "x"'))
    assert broken.config_text == ""  # no JSON: its secrets cannot be found, so withheld


def test_a_plan_shown_to_a_non_owner_hides_secret_values() -> None:
    plan = p.ConfigPlanView(
        base="a",
        version="b",
        engines=[
            p.EnginePlan(
                alias="a",
                action="restart",
                fields=[
                    p.FieldChange(
                        field="kt.extra_env", old={"HF_TOKEN": "hf-1"}, new={"HF_TOKEN": "hf-2"}
                    ),
                    p.FieldChange(
                        field="kt.extra_args", old=["--api-key", "k1"], new=["--tp", "2"]
                    ),
                    p.FieldChange(field="kt.ctx", old=1, new=2),
                ],
            )
        ],
    )
    shown = json.dumps(msgspec.to_builtins(trust.shown_plan(plan)))
    fields = {f.field: (f.old, f.new) for f in plan.engines[0].fields}
    assert fields["kt.extra_env"] == ({"HF_TOKEN": "(hidden)"}, {"HF_TOKEN": "(hidden)"})
    assert fields["kt.extra_args"] == (["--api-key", "(hidden)"], ["--tp", "2"])
    assert fields["kt.ctx"] == (1, 2)
    assert "hf-" not in shown


def test_a_launch_shown_to_a_non_owner_hides_the_models_own_environment() -> None:
    spec = config([entry("a", extra_env={"HF_TOKEN": "hf-1", "KTD_X": "2"})]).models["a"]
    plan = {
        "env": {"HF_TOKEN": "hf-1", "KTD_X": "2", "CUDA_VISIBLE_DEVICES": "0"},
        "argv": ["python", "--ssl-keyfile-password", "pw", "--port", "30000"],
        "argv_flags": ["--api-key=k", "--tp", "2"],
        "flags": [{"name": "--admin-api-key", "values": ["a"]}, {"name": "--tp", "values": ["2"]}],
    }
    shown = trust.hidden_launch(plan, spec)
    assert shown["env"] == {
        "HF_TOKEN": "(hidden)",
        "KTD_X": "(hidden)",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert shown["argv"] == ["python", "--ssl-keyfile-password", "(hidden)", "--port", "30000"]
    assert shown["argv_flags"] == ["--api-key=(hidden)", "--tp", "2"]
    assert [f["values"] for f in shown["flags"]] == [["(hidden)"], ["2"]]
    assert plan["env"]["HF_TOKEN"] == "hf-1"  # a copy
    assert (
        trust.is_owner(0, OWNER) and trust.is_owner(OWNER, OWNER) and not trust.is_owner(5, OWNER)
    )


def test_a_mark_goes_back_only_to_the_field_and_model_it_came_from() -> None:
    """An admin must not copy a secret it cannot see to where it would leave (another
    model's environment beside an endpoint of its choosing, a flag): refused, by name."""
    cfg = json.dumps({"gateway": {"api_key": "gw-secret"}})
    models = json.dumps([entry("a", extra_env={"HF_TOKEN": "hf-1"}), entry("b")])
    got = trust.masked(p.ConfigReply(version="v", config_text=cfg, models_text=models))
    shown = json.loads(got.models_text or "")
    mark_of_hf = shown[0]["kt"]["extra_env"]["HF_TOKEN"]
    # Moved with its entry (reordered): still its own place.
    moved = json.dumps([shown[1], shown[0]])
    back = json.loads(trust.unmasked(None, moved, (cfg, models))[1] or "")
    assert back[1]["kt"]["extra_env"]["HF_TOKEN"] == "hf-1"
    for elsewhere in (
        [shown[0], {**shown[1], "kt": {"extra_env": {"HF_TOKEN": mark_of_hf}}}],  # b's env
        [{**shown[0], "kt": {"extra_env": {"OTHER": mark_of_hf}}}, shown[1]],  # a's other name
        [{**shown[0], "kt": {"extra_args": ["--api-key", mark_of_hf]}}, shown[1]],  # a flag
        [
            {
                **shown[0],
                "kt": {
                    "extra_env": {"HF_TOKEN": json.loads(got.config_text)["gateway"]["api_key"]}
                },
            }
        ],
    ):
        with pytest.raises(secret.MarkError, match="stood elsewhere"):
            trust.unmasked(None, json.dumps(elsewhere), (cfg, models))
