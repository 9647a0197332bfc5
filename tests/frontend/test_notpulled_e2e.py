"""A request for a catalog name not pulled, through a real frontend and daemon (issue 44
item 5): a 404 in the OpenAI shape (the official client) and in Ollama's (the official
client) that says the name is in the catalog but not pulled and gives the command, and
no pull started; with ``catalog.http_pulls`` the request pulls (from the hub stand-in),
waits for it as for a load, and is answered."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.catalog.conftest import MiB, hub
from tests.conftest import wait_for
from tests.hub.standin import StandIn
from tests.ktctl.test_loadpull_e2e import CATALOG, NAME, SIM_ENV

pytestmark = pytest.mark.e2e
__all__ = ["hub"]  # the stand-in fixture, shared with the catalog tests


def start(
    daemon_factory: Any,
    frontend_factory: Any,
    write_config: Any,
    ktd_env: dict[str, str],
    hub: StandIn,
    tmp_path: Path,
    http_pulls: bool,
) -> tuple[Any, Any]:
    path = write_config([], ktransformers={"extra_env": SIM_ENV})  # the sim, by the entry
    (path.parent / "tiny-catalog.json").write_text(json.dumps(CATALOG))
    cfg = json.loads(path.read_text())
    cfg["catalog"] = {
        "files": ["tiny-catalog.json"],
        "dir": str(tmp_path / "models"),
        "http_pulls": http_pulls,
    }
    path.write_text(json.dumps(cfg))
    env = {**ktd_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    return daemon_factory(path, env=env), frontend_factory(path, env=env)


def pulls(d: Any) -> list[dict[str, Any]]:
    r = d.ktctl("pulls", "--json")
    assert r.returncode == 0, r.stderr
    jobs: list[dict[str, Any]] = json.loads(r.stdout)["pulls"]
    return jobs


def test_a_catalog_name_not_pulled_is_a_404_that_says_so_and_pulls_nothing(
    daemon_factory: Any,
    frontend_factory: Any,
    write_config: Any,
    ktd_env: dict[str, str],
    hub: StandIn,
    tmp_path: Path,
) -> None:
    d, fe = start(
        daemon_factory, frontend_factory, write_config, ktd_env, hub, tmp_path, http_pulls=False
    )
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    err = info.value
    assert err.code == "model_not_found" and err.param == "model"
    assert f"is in ktd's catalog ({NAME}) but not pulled" in err.message, err.message
    assert f"`ktctl load {NAME} --pull`" in err.message and "catalog.http_pulls" in err.message
    # Ollama's shape: {"error": "..."} with its 404, read by the official client.
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=fe.url, timeout=30).chat(
            model="tiny-alias", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 404
    assert "but not pulled" in caught.value.error and "ktctl load tiny-alias --pull" in (
        caught.value.error
    )
    # Ollama's load (an empty generate): the same 404, in its shape.
    r = httpx.post(fe.url + "/api/generate", json={"model": NAME}, timeout=30)
    assert r.status_code == 404 and "but not pulled" in r.json()["error"], r.text
    # A name no catalog knows keeps OpenAI's own words.
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nowhere", messages=[{"role": "user", "content": "x"}])
    assert "does not exist" in info.value.message and "catalog" not in info.value.message
    assert pulls(d) == [] and not hub.sent


def test_with_http_pulls_the_request_pulls_and_is_answered(
    daemon_factory: Any,
    frontend_factory: Any,
    write_config: Any,
    ktd_env: dict[str, str],
    hub: StandIn,
    tmp_path: Path,
) -> None:
    d, fe = start(
        daemon_factory, frontend_factory, write_config, ktd_env, hub, tmp_path, http_pulls=True
    )
    hub.rate = 8 * MiB  # half a second of pull: the request waits through it
    client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    got: dict[str, Any] = {}

    def ask() -> None:
        try:
            got["reply"] = client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "hi"}]
            )
        except Exception as exc:  # reported by the assertion below
            got["error"] = exc

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        wait_for(
            lambda: [j["state"] for j in pulls(d)] == ["done"], timeout=30, what="the pull done"
        )
    finally:
        asker.join(60)
    assert "reply" in got, got
    assert got["reply"].choices[0].message.content
    # The entry the request loaded is the pull's, written by the config desk.
    written = json.loads((d.config.parent / "models.json").read_text())
    assert [m["alias"] for m in written] == [NAME] and written[0]["catalog"] == NAME
    assert hub.sent["model.safetensors"] == 4 * MiB
