"""Config loading: the seed's format, defaults, and errors that name file and field."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ktd.core.config import ConfigError, parse_env, split_args
from ktd.core.configload import load_config


def write(tmp_path: Path, cfg: Any, models: Any | None = None) -> Path:
    path = tmp_path / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    if models is not None:
        (tmp_path / "models.json").write_text(
            models if isinstance(models, str) else json.dumps(models)
        )
    return path


SEED = {
    "ktransformers": {
        "enabled": True,
        "model_path": "/models/DeepSeek-V4",
        "kt_weight_path": "/models/DeepSeek-V4-kt",
        "model_id": "ktransformers",
        "host": "127.0.0.1",
        "port": 0,
        "ctx": 32768,
        "extra_args": ["--tp-size", "1"],
        "extra_env": {"KT_KERNEL_DEBUG": "1"},
        "auto_build": False,
    },
    "models_file": "models.json",
    "daemon": {},
    "frontend": {},
}


def test_seed_config_loads_with_its_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED, []))
    spec = cfg.models["ktransformers"]
    assert spec.served and spec.path == "/models/DeepSeek-V4"
    assert spec.kt_weight_path == "/models/DeepSeek-V4-kt"
    assert spec.ctx == 32768 and spec.port == 0
    assert spec.extra_args == ("--tp-size", "1")
    assert spec.env == {"KT_KERNEL_DEBUG": "1"}
    assert spec.python == sys.executable
    assert cfg.frontend.bind == "127.0.0.1:8000" and cfg.frontend.autoload


def test_empty_section_gets_the_seed_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {"ktransformers": {}}))
    kt = cfg.file.ktransformers
    assert (kt.model_id, kt.port, kt.auto_build, kt.enabled) == ("ktransformers", 0, False, True)
    assert cfg.models == {}  # no model_path: the section itself serves nothing


def test_models_inherit_section_defaults_and_override(tmp_path: Path) -> None:
    models = [
        {"path": "/m/a", "backend": "kt", "alias": "a-kt"},
        {
            "path": "/m/b",
            "backend": "kt",
            "alias": "b-kt",
            "kt": {
                "ctx": 8192,
                "extra_args": "--kt-cpuinfer 12 --kt-method 'AMXINT4'",
                "extra_env": "FOO=1 BAR='two words'",
            },
        },
        {"path": "/m/c", "backend": "ds4", "alias": "c"},
    ]
    cfg = load_config(write(tmp_path, SEED, models))
    a, b, c = cfg.models["a-kt"], cfg.models["b-kt"], cfg.models["c"]
    assert a.ctx == 32768 and a.extra_args == ("--tp-size", "1")
    assert a.kt_weight_path == "/models/DeepSeek-V4-kt"
    assert b.ctx == 8192
    assert b.extra_args == ("--kt-cpuinfer", "12", "--kt-method", "AMXINT4")
    assert b.env == {"KT_KERNEL_DEBUG": "1", "FOO": "1", "BAR": "two words"}
    assert not c.served and "ds4" in (c.not_served_reason or "")
    assert [m.alias for m in cfg.served()] == ["ktransformers", "a-kt", "b-kt"]


def test_routing_is_exact(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            {"ktransformers": {}},
            [{"path": "/m", "backend": "kt", "alias": "deepseek-v4-kt"}],
        )
    )
    assert cfg.route("deepseek-v4-kt") is not None
    for near in ("deepseek-v4", "deepseek-v4-kt ", "DeepSeek-V4-kt", "deepseek", "v4-kt", ""):
        assert cfg.route(near) is None


def test_model_id_routes_the_section_engine(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {"ktransformers": {"model_path": "/m", "model_id": "big"}}))
    assert cfg.route("big") is not None and cfg.route("ktransformers") is None


@pytest.mark.parametrize(
    ("cfg", "models", "where"),
    [
        ({"ktransformers": {"port": "80"}}, None, "$.ktransformers.port"),
        ({"ktransformers": {"colour": 1}}, None, "$.ktransformers"),
        ({"ktransformers": {"port": 70000}}, None, "$.ktransformers.port"),
        ({"ktransformers": {"model_id": "a:b"}}, None, "$.ktransformers.model_id"),
        ({"ktransformers": {"extra_env": "NOEQUALS"}}, None, "$.ktransformers.extra_env word 1"),
        ({"ktransformers": {"extra_args": "--a 'unclosed"}}, None, "$.ktransformers.extra_args"),
        ({"daemon": {"drain_timeout": -1}}, None, "$.daemon.drain_timeout"),
        ({"frontend": {"bind": "nohostport"}}, None, "$.frontend.bind"),
        ({"frontend": {"ui_control": True}}, None, "$.frontend.ui_control"),
        ({"frontend": {"ui_control": "yes", "api_keys": ["k"]}}, None, "$.frontend.ui_control"),
        ({}, [{"path": "/m", "backend": "kt", "alias": "x"}, {"path": 3}], "$[1].path"),
        ({}, [{"path": "/m", "backend": "kt", "alias": ""}], "$[0].alias"),
        ({}, [{"path": "/m", "backend": "kt", "alias": "qwen:lora"}], "$[0].alias"),
        ({}, [{"path": "/m", "backend": "kt", "alias": "a", "kt": {"nope": 1}}], "$[0].kt"),
        ({}, [{"path": "/m", "backend": "kt", "alias": "a", "numa": "some"}], "$[0].numa"),
        ({}, [{"path": "/m", "backend": "kt", "alias": "a", "fit": "maybe"}], "$[0].fit"),
        (
            {},
            [
                {"path": "/m", "backend": "kt", "alias": "a"},
                {"path": "/n", "backend": "kt", "alias": "a"},
            ],
            "$[1].alias",
        ),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, cfg: Any, models: Any, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, cfg, models))
    err = info.value
    expected_file = "models.json" if models is not None and "$[" in where else "config.json"
    assert err.file.endswith(expected_file), str(err)
    assert err.path == where, str(err)
    assert str(err).startswith(err.file + ": " + where)


def test_bad_json_names_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, '{"ktransformers": {\n "port": 1,,\n}}'))
    assert "line 2" in str(info.value) and str(info.value).startswith(str(tmp_path))


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"\$\.models_file"):
        load_config(write(tmp_path, {"models_file": "elsewhere.json"}))


def test_enabled_false_lists_but_serves_nothing(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            {"ktransformers": {"enabled": False, "model_path": "/m"}},
            [{"path": "/m", "backend": "kt", "alias": "a"}],
        )
    )
    assert cfg.served() == [] and set(cfg.models) == {"ktransformers", "a"}


def test_env_and_args_forms() -> None:
    assert parse_env(["A=1", "B=x=y"], "f", "$") == {"A": "1", "B": "x=y"}
    assert parse_env("A=1 B='x y'", "f", "$") == {"A": "1", "B": "x y"}
    assert parse_env({"A": "1"}, "f", "$") == {"A": "1"}
    with pytest.raises(ConfigError, match=r"\$\[1\]"):
        parse_env(["A=1", "=2"], "f", "$")
    with pytest.raises(ConfigError, match="not a valid"):
        parse_env({"1A": "x"}, "f", "$")
    assert split_args("--a 1 --b 'x y'", "f", "$") == ("--a", "1", "--b", "x y")


@pytest.mark.parametrize(
    ("kt", "field"),
    [
        ({"nnodes": 2}, "nnodes"),
        ({"dist_init_addr": "10.0.0.1:5000"}, "dist_init_addr"),
        ({"nodes": ["h1", "h2"]}, "nodes"),
    ],
)
def test_multi_host_kt_is_refused_not_ignored(tmp_path: Path, kt: Any, field: str) -> None:
    """kt-kernel cannot span hosts (ktransformers #874): the fields are refused, pointing at
    scale-out by replicas; a non-kt entry with them is listed, never served, so it loads."""
    models = [{"path": "/m", "backend": "kt", "alias": "a", "kt": kt}]
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"ktransformers": {}}, models))
    assert f"models.json: $[0].kt.{field}: " in str(err.value)
    assert "cannot span hosts" in str(err.value) and "sglang-router" in str(err.value)
    other = [{"path": "/m", "backend": "ds4", "alias": "a", "kt": kt}]
    assert load_config(write(tmp_path, {"ktransformers": {}}, other)).route("a") is None
    single = [{"path": "/m", "backend": "kt", "alias": "a", "kt": {"nnodes": 1}}]
    assert load_config(write(tmp_path, {"ktransformers": {}}, single)).route("a") is not None


def test_a_fifo_a_device_or_a_huge_file_is_refused_at_once_naming_the_file(
    tmp_path: Path,
) -> None:
    """Issue 31, item 6: a FIFO froze the daemon, /dev/zero grew it to 1.86 GB."""
    import os

    from ktd.core.configload import MAX_CONFIG_BYTES

    with pytest.raises(ConfigError, match=r"/dev/zero.*not a regular file \(a character device\)"):
        load_config("/dev/zero")
    cfg = write(tmp_path, SEED)
    fifo = tmp_path / "models.json"
    os.mkfifo(fifo)  # nobody writes: opening it for reading would block for ever
    with pytest.raises(ConfigError, match=r"models\.json.*not a regular file \(a FIFO\)"):
        load_config(cfg)
    fifo.unlink()
    fifo.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match=r"models\.json.*more than"):
        load_config(cfg)


def test_an_environment_variable_the_kernel_would_refuse_is_a_config_error() -> None:
    """Issue 31, item 8: a 3 MB ``extra_env`` was "internal error while supervising:
    OSError(7, 'Argument list too long')" at the load."""
    with pytest.raises(ConfigError, match=r"\$\.kt\.extra_env\.BIG: 3145728 bytes"):
        parse_env({"BIG": "x" * (3 << 20)}, "models.json", "$.kt.extra_env")
    assert parse_env({"OK": "x" * 1000}, "m", "$") == {"OK": "x" * 1000}


@pytest.mark.parametrize(
    ("alias", "words"),
    [
        ("a" * 257, "no model name is longer than 256"),
        ("é" * 130, "bytes in UTF-8"),  # 130 characters, 260 bytes: no file name for its log
        ("evil\u202egnp.exe", "control or format characters"),
        ("zero\u200bwidth", "control or format characters"),
    ],
)
def test_aliases_the_rest_cannot_carry_are_refused_with_file_and_field(
    tmp_path: Path, alias: str, words: str
) -> None:
    models = [{"path": "/m", "backend": "kt", "alias": "ok"}, {"path": "/m", "backend": "kt"}]
    models[1]["alias"] = alias
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, {"models_file": "models.json"}, models))
    assert "models.json" in str(info.value) and "$[1].alias" in str(info.value)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("cfg", "models", "field"),
    [
        ({}, [{"path": "/m", "backend": "kt", "alias": "m", "ttl": 1e300}], "$[0].ttl"),
        ({"daemon": {"lease_ttl": 4e9}}, [], "$.daemon.lease_ttl"),
        ({"frontend": {"load_timeout": 1e10}}, [], "$.frontend.load_timeout"),
    ],
)
def test_durations_keep_the_protocol_s_bound(
    tmp_path: Path, cfg: dict[str, Any], models: list[Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=r"at most 1e\+09 seconds") as info:
        load_config(write(tmp_path, {"models_file": "models.json", **cfg}, models))
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("config", "models", "named", "says"),
    [
        ('{"daemon": ' + "[" * 1000 + "]" * 1000 + "}", "[]", "config.json", "nested"),
        ("{}", '[{"alias": "a", "x": ' + "{" * 500 + "}" * 500 + "}]", "models.json", "nested"),
        ('{"models_file": "m\xff.json"}', "[]", "config.json", "UTF-8"),
        ("{}", '[{"alias": "a\xff", "model_path": "/m"}]', "models.json", "UTF-8"),
    ],
)
def test_a_hand_written_file_nested_too_deeply_or_not_utf8_is_an_error_naming_it(
    tmp_path: Path, config: str, models: str, named: str, says: str
) -> None:
    """Issue 43: 1,000 nested arrays in config.json raised RecursionError out of
    ``ktd serve`` (a traceback); now a ConfigError naming the file, as for bad JSON."""
    (tmp_path / "config.json").write_bytes(config.encode("latin-1"))
    (tmp_path / "models.json").write_bytes(models.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "config.json")
    assert info.value.file == str(tmp_path / named)
    assert says in info.value.message
