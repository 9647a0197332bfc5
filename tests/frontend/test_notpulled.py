"""The ``not_pulled`` error (issue 44): the daemon's ``unknown_model`` with a catalog
entry named becomes a 404 that says so, in each API's shape; without one it stays
OpenAI's own words."""

from __future__ import annotations

import json

from ktd.frontend import errors
from ktd.protocol import ErrorCode


def test_a_catalog_name_is_a_404_that_gives_the_command_in_every_shape() -> None:
    detail = {
        "models": ["other"],
        "catalog": "deepseek-v4-flash",
        "command": "ktctl load v4 --pull",
    }
    err = errors.from_control("v4", ErrorCode.UNKNOWN_MODEL, "unknown model 'v4'", detail)
    assert err.status == 404 and err.code == "model_not_found" and err.param == "model"
    said = "is in ktd's catalog (deepseek-v4-flash) but not pulled: run `ktctl load v4 --pull`"
    assert said in err.message and "catalog.http_pulls" in err.message
    assert said in json.loads(err.body())["error"]["message"]
    assert said in json.loads(err.anthropic_body())["error"]["message"]
    assert said in json.loads(err.ollama_body())["error"]


def test_without_a_catalog_entry_it_is_openais_unknown_model() -> None:
    err = errors.from_control("x", ErrorCode.UNKNOWN_MODEL, "unknown", {"models": ["a"]})
    assert err.message == "The model `x` does not exist. Available models: a"
