"""Errors every client can read: the Node ``openai`` and ``ollama`` packages, installed
with npm (cached under ``$KTD_NODE_CACHE``, default ``~/.cache/ktd-node``), against
the real daemon, frontend and sim. SGLang's own errors (``{"object": "error", ...}``)
reach them in their route's shape, and ktd's own errors too (issue 32: the Node
``openai`` SDK showed SGLang's as "400 status code (no body)")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ConfigWriter, sim_model

PACKAGES = ("openai@6.49.0", "ollama@0.6.4")

SCRIPT = r"""
const OpenAI = require("openai");
const { Ollama } = require("ollama");
const url = process.argv[1];
const out = {};
async function caught(name, call) {
  try { await call(); out[name] = { ok: true }; }
  catch (e) { out[name] = { status: e.status ?? e.status_code, message: e.message }; }
}
(async () => {
  const openai = new OpenAI({ baseURL: url + "/v1", apiKey: "x", maxRetries: 0 });
  const ollama = new Ollama({ host: url });
  await caught("embedding", () => openai.embeddings.create({ model: "m1", input: "x" }));
  await caught("unknown", () =>
    openai.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "hi" }] }));
  await caught("ollama_bad", () =>
    ollama.chat({ model: "m1", messages: [{ role: "user", content: "hi" }], options: "x" }));
  await caught("ollama_unknown", () => ollama.chat({ model: "nope", messages: [] }));
  console.log(JSON.stringify(out));
})();
"""


@pytest.fixture(scope="session")
def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed (apt-get install -y nodejs npm)"
    root = Path(os.environ.get("KTD_NODE_CACHE", Path.home() / ".cache" / "ktd-node"))
    prefix = root / "-".join(p.replace("@", "") for p in PACKAGES)
    if not (prefix / "node_modules" / "ollama").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", *PACKAGES],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return prefix / "node_modules"


def test_the_node_clients_read_engine_and_ktd_errors(
    node_modules: Path, write_config: ConfigWriter, daemon_factory: Any, frontend_factory: Any
) -> None:
    cfg = write_config([sim_model("m1")])
    daemon_factory(cfg)
    fe = frontend_factory(cfg)
    ran = subprocess.run(
        ["node", "-e", SCRIPT, fe.url],
        env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    # SGLang's own 400 (a generation model has no embeddings), as OpenAI's shape.
    assert got["embedding"]["status"] == 400
    assert "embedding model" in got["embedding"]["message"], got["embedding"]
    assert "no body" not in got["embedding"]["message"]
    assert got["unknown"]["status"] == 404 and "does not exist" in got["unknown"]["message"]
    # SGLang's validation error on Ollama's route, as Ollama's {"error": "..."}.
    assert got["ollama_bad"]["status"] == 400
    assert "validation error" in got["ollama_bad"]["message"], got["ollama_bad"]
    assert got["ollama_unknown"]["status"] == 404
    assert "nope" in got["ollama_unknown"]["message"]
