"""The config's ``gateway`` section: off by default, every error names its file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktd.core.config import ConfigError
from ktd.core.configload import load_config


def write(tmp_path: Path, gateway: Any, **more: Any) -> Path:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"gateway": gateway, **more}))
    return cfg


def test_gateway_section_defaults_off(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {}))
    assert cfg.gateway.routers == [] and cfg.gateway.mode == "engines"


@pytest.mark.parametrize(
    ("gateway", "more", "path"),
    [
        ({"routers": ["http://r:1"], "bogus": 1}, {}, "$.gateway"),
        ({"routers": ["r:1"]}, {}, "$.gateway.routers[0]"),
        ({"routers": ["http://r:1", "http://r:1/"]}, {}, "$.gateway.routers"),
        ({"mode": "pods"}, {}, "$.gateway.mode"),
        ({"reconcile_interval": 0}, {}, "$.gateway.reconcile_interval"),
        ({"labels": {"bad key": "x"}}, {}, "$.gateway.labels.bad key"),
        ({"labels": {"k": 1}}, {}, "$.gateway.labels"),
        ({"advertise": "a b"}, {}, "$.gateway.advertise"),
        ({"model_id": "a:b"}, {}, "$.gateway.model_id"),
        (
            {"routers": ["http://r:1"], "mode": "frontend"},
            {"frontend": {"bind": "unix:/tmp/x"}},
            "$.gateway.mode",
        ),
    ],
)
def test_gateway_errors_name_file_and_field(
    tmp_path: Path, gateway: Any, more: Any, path: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, gateway, **more))
    assert err.value.file.endswith("config.json")
    assert err.value.path.startswith(path), err.value
