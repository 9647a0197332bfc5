"""Issue 44's headline, as a fresh user goes: ``ktd init``'s config with an operator's catalog file
naming a tiny model whose repo the hub stand-in serves, a real daemon (the sim as the
engine), ``ktctl pull NAME`` to done, the models.json entry written by the pull (history
``how: pull``), ``ktctl load NAME``, and a chat answered through the real frontend with
the official openai client. A pull this box cannot run is refused before its first byte,
with the numbers."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from ktd.catalog import layout, verify
from ktd.sim.model import SIM_CONFIG
from tests.catalog.test_pulls_e2e import Pty
from tests.conftest import REPO, SHIM, SIM_TIMES
from tests.frontend.conftest import launch_frontend
from tests.hub.standin import Repo, StandIn

pytestmark = pytest.mark.e2e

NAME = "tiny-sim"
ALIAS = f"{NAME}-kt"
SOURCE = "ktd-tests/tiny-sim"


def safetensors(tensors: dict[str, int]) -> bytes:
    """A valid safetensors file of BF16 vectors (what ktd's weight reader parses)."""
    header: dict[str, Any] = {}
    offset = 0
    for key, n in tensors.items():
        header[key] = {"dtype": "BF16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + os.urandom(offset)


def entry(name: str, **needs: Any) -> dict[str, Any]:
    return {
        "name": name,
        "aliases": [f"{name}-kt"],
        "family": "qwen2-moe",
        "description": "The sim's shape, served by the hub stand-in",
        "sources": [
            {
                "role": "model",
                "repo": SOURCE,
                "revision": None,
                "ref": "main",
                "patterns": ["*.json", "*.safetensors"],
                "refs": ["tests/catalog/test_first_model_e2e.py"],
            }
        ],
        "variants": [
            {"name": "sglang", "kt_method": None, "refs": ["tests/catalog/test_first_model_e2e.py"]}
        ],
        "defaults": {
            "args": ["--chunked-prefill-size", "2048"],
            "tool_call_parser": "qwen25",
            "refs": ["tests/catalog/test_first_model_e2e.py"],
        },
        "needs": {"gpu": False, **needs},
        "refs": ["tests/catalog/test_first_model_e2e.py"],
    }


def test_pull_a_catalog_name_then_load_it_and_chat(
    daemon_factory: Any,
    ktd_env: dict[str, str],
    tmp_path: Path,
) -> None:
    hub = StandIn()
    cfg_json = json.dumps({**SIM_CONFIG, "_name_or_path": NAME}).encode()
    weights = safetensors({"model.embed_tokens.weight": 4096, "lm_head.weight": 4096})
    hub.add(Repo(SOURCE, {"config.json": cfg_json, "model.safetensors": weights}))
    with hub:
        # The engine is the sim, through the sglang shim: the global kt section's env, so
        # the entry the pull writes is what a real box's would be (no test's own knobs).
        # ``ktd init``'s config, as a fresh user has it (its placeholder model included),
        # plus the operator's catalog file.
        path = tmp_path / "etc" / "config.json"
        init = subprocess.run(
            [sys.executable, "-m", "ktd", "init", "--config", str(path)],
            env=ktd_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert init.returncode == 0, init.stderr
        placeholder = json.loads((path.parent / "models.json").read_text())
        site = path.parent / "catalog.d" / "site.json"
        site.parent.mkdir()
        huge = entry("tiny-huge", host_ram_gb=900_000)
        site.write_text(json.dumps({"catalog": 1, "models": [entry(NAME), huge]}))
        cfg = json.loads(path.read_text())
        cfg["catalog"] = {"files": ["catalog.d/site.json"], "dir": str(tmp_path / "models")}
        sim_env = {"PYTHONPATH": os.pathsep.join((str(SHIM), str(REPO))), **SIM_TIMES}
        cfg["ktransformers"]["extra_env"] = sim_env
        path.write_text(json.dumps(cfg))
        env = {**ktd_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
        d = daemon_factory(path, env=env)

        # A pull this box cannot run: refused before any byte, with the numbers.
        r = d.ktctl("pull", "tiny-huge")
        assert r.returncode == 1, r.stdout + r.stderr
        refusal = "this box cannot run tiny-huge: sglang (plain SGLang): needs 900,000 GB of RAM"
        assert "refused: " + refusal in r.stdout and "(--force fetches it anyway)" in r.stdout
        assert not hub.sent

        # The dry run: the plan, and each flag with its origin.
        r = d.ktctl("pull", NAME, "--dry-run")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "to fetch" in r.stdout and "fits: yes" in r.stdout
        assert "--tool-call-parser qwen25" in r.stdout and "catalog" in r.stdout
        assert not hub.sent

        # The pull, by an alias, to its end: the entry is written through the config desk,
        # under the name it was pulled by (``ktctl pull X`` then ``ktctl load X``).
        # On a terminal, as a person runs it: the bar, the end, what the desk did.
        argv = [sys.executable, "-m", "ktctl", "--socket", str(d.socket), "pull", ALIAS]
        term = Pty(argv, d.env)
        out = term.read_until(b"starts it")
        assert term.wait() == 0, out
        text = out.decode()
        assert f"\r\x1b[K{ALIAS} [" in text  # the bar, redrawn in place
        assert f"{ALIAS} ({SOURCE}@main) done" in text
        dest = layout.dest_for(tmp_path / "models", SOURCE, "main")
        assert verify.verified(dest) == (True, [])
        assert f"{ALIAS} added to models.json (version 2, how: pull): add: {ALIAS}" in text
        assert f"`ktctl load {ALIAS}` starts it" in text
        [*kept, model] = json.loads((path.parent / "models.json").read_text())
        assert kept == placeholder  # the user's models stay as they were
        assert model["alias"] == ALIAS and model["path"] == str(dest)
        assert model["kt"]["extra_args"] == [
            "--chunked-prefill-size", "2048", "--tool-call-parser", "qwen25",
        ]  # fmt: skip
        r = d.ktctl("config", "history", "--json")
        assert r.returncode == 0, r.stderr
        latest = max(json.loads(r.stdout)["versions"], key=lambda v: v["seq"])
        assert latest["how"] == "pull" and latest["claimed"] == f"ktctl pull {ALIAS}", latest
        # ktctl catalog: on disk now, and in models.json.
        r = d.ktctl("catalog")
        row = next(x for x in r.stdout.splitlines() if x.startswith(NAME + " "))
        assert "model (" in row and "in models.json" in row, row

        r = d.ktctl("load", ALIAS)
        assert r.returncode == 0, r.stdout + r.stderr
        fe = launch_frontend(path, env, tmp_path / "frontend.log")
        client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0)
        try:
            reply = client.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
        finally:
            client.close()
            fe.stop()
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 4

        # The user sets a flag of their own; a pull again (by the entry's own name) merges
        # into their model, their flag winning; nothing is added twice.
        model["kt"]["extra_args"] = ["--chunked-prefill-size", "4096"]
        (path.parent / "models.json").write_text(json.dumps([*kept, model]))
        assert d.ktctl("reload").returncode == 0
        sent = dict(hub.sent)
        r = d.ktctl("pull", NAME)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{ALIAS} merged into models.json" in r.stdout, r.stdout
        assert "your --chunked-prefill-size 4096 kept (the pull's: 2048)" in r.stdout
        [*_, model] = json.loads((path.parent / "models.json").read_text())
        assert model["kt"]["extra_args"] == [
            "--chunked-prefill-size", "4096", "--tool-call-parser", "qwen25",
        ]  # fmt: skip
        assert dict(hub.sent) == sent  # nothing fetched twice
