"""``ktctl load NAME`` for a catalog name not pulled (issue 44 item 5), against a real
daemon, the hub stand-in and the tests' catalog file: the refusal says what a pull
fetches (the hub's bytes) and, once a pull has finished here, how long it takes at that
rate, and the command; ``--pull`` draws the pull's bar on a real terminal, then loads."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from ktctl.cli import EXIT_UNKNOWN_MODEL
from tests.catalog.conftest import MiB, hub, tiny_repo
from tests.conftest import REPO, SHIM, SIM_TIMES, sim_model
from tests.hub.standin import StandIn
from tests.ptyproc import PtyProc

pytestmark = pytest.mark.e2e
__all__ = ["hub"]  # the stand-in fixture, shared with the catalog tests

NAME = "tiny-kt"
CONFIG = b'{"architectures": ["TinyForCausalLM"]}\n'  # tiny_repo()'s config.json

SIM_ENV = {"PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))), **SIM_TIMES}

#: A catalog entry of the stand-in's ``org/tiny`` (a dense model: no kt method, no GPU).
CATALOG = {
    "catalog": 1,
    "models": [
        {
            "name": NAME,
            "aliases": ["tiny-alias"],
            "family": "qwen2",
            "description": "the stand-in's tiny repo",
            "sources": [
                {
                    "role": "model",
                    "repo": "org/tiny",
                    "revision": None,
                    "ref": "main",
                    "patterns": ["*.json", "*.safetensors"],
                    "refs": ["tests/catalog/conftest.py"],
                }
            ],
            "variants": [{"name": "sglang", "kt_method": None, "refs": ["tests/hub"]}],
            "needs": {"gpu": False, "disk_gb": 7},
            "refs": ["tests/catalog/conftest.py"],
        }
    ],
}


def start(
    daemon_factory: Any,
    write_config: Any,
    ktd_env: dict[str, str],
    hub: StandIn,
    tmp_path: Path,
    **frontend: Any,
) -> Any:
    # The engine is the sim, through the sglang shim: the global kt section's env, so the
    # entry the pull writes through the config desk is what a real box's would be.
    path = write_config([], ktransformers={"extra_env": SIM_ENV}, frontend=frontend or None)
    (path.parent / "tiny-catalog.json").write_text(json.dumps(CATALOG))
    cfg = json.loads(path.read_text())
    cfg["catalog"] = {"files": ["tiny-catalog.json"], "dir": str(tmp_path / "models")}
    path.write_text(json.dumps(cfg))
    env = {**ktd_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
    return daemon_factory(path, env=env)


def test_a_load_of_a_catalog_name_not_pulled_says_what_a_pull_takes(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    hub.add(tiny_repo("org/other", size=2 * MiB))
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    r = d.ktctl("load", NAME)
    assert r.returncode == EXIT_UNKNOWN_MODEL, r.stdout + r.stderr
    said = r.stderr
    assert f"{NAME} is in ktd's catalog ({NAME}) but not pulled" in said, said
    assert "a pull fetches 4.0 MiB (the hub's metadata)" in said, said
    assert "no pull has finished here yet" in said, said
    assert f"Run: ktctl load {NAME} --pull" in said, said
    assert not hub.sent  # the dry run read metadata only
    # A name the catalog does not know stays the plain refusal.
    r = d.ktctl("load", "nowhere")
    assert r.returncode == EXIT_UNKNOWN_MODEL and "catalog" not in r.stderr, r.stderr
    # A pull finishes: its rate is this box's, and the next refusal times the pull with it.
    assert d.ktctl("pull", "--repo", "org/other").returncode == 0
    r = d.ktctl("load", "tiny-alias", "--json")
    assert r.returncode == EXIT_UNKNOWN_MODEL
    doc = json.loads(r.stdout)["error"]
    detail = doc["detail"]
    assert detail["catalog"] == NAME and detail["bytes"] == 4 * MiB + len(CONFIG)
    assert detail["rate"] > 0 and detail["seconds"] == pytest.approx(
        detail["bytes"] / detail["rate"], abs=0.1
    )
    assert detail["command"] == "ktctl load tiny-alias --pull"
    assert re.search(r"about \d\d:\d\d at this box's last pull rate \(", doc["message"]), doc
    # An entry written before its files are here (its directory not on disk): the same.
    entry = sim_model(NAME, path=str(tmp_path / "models" / "not-yet"))
    (d.config.parent / "models.json").write_text(json.dumps([entry]))
    assert d.ktctl("reload").returncode == 0
    r = d.ktctl("load", NAME)
    assert r.returncode != 0 and r.stderr.startswith("ktctl: load_failed: "), r.stderr
    assert "but not pulled" in r.stderr and f"ktctl load {NAME} --pull" in r.stderr, r.stderr
    # Another name of an entry models.json has: not "not pulled", the plain refusal.
    r = d.ktctl("load", "tiny-alias")
    assert r.returncode == EXIT_UNKNOWN_MODEL and "catalog" not in r.stderr, r.stderr


def test_load_pull_draws_the_bar_on_a_terminal_then_loads(
    daemon_factory: Any, write_config: Any, ktd_env: dict[str, str], hub: StandIn, tmp_path: Path
) -> None:
    d = start(daemon_factory, write_config, ktd_env, hub, tmp_path)
    hub.rate = 4 * MiB  # a second of bar
    argv = [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "load", NAME, "--pull"]
    with PtyProc(argv, d.env) as tty:
        tty.expect("%")
        assert re.search(r"tiny-kt \[[#-]+\]\s+\d+% ", tty.text), tty.text
        tty.expect(" done ")
        tty.expect("ready")  # the pull's entry, written by the config desk, then the load
        assert tty.wait() == 0, tty.text
    assert hub.sent["model.safetensors"] == 4 * MiB
    assert d.engines()[NAME]["state"] == "ready"
