"""The same requests to the real SGLang server, through ktd's frontend, and to the sim.

``ROUTES`` is every route the frontend proxies (and the Ollama routes SGLang serves
that the frontend answers itself); ``answer`` reduces a reply to what must agree
between the real server and the sim: the status, the media type and the *shape*
(the keys of a JSON object, of a list's first item, of an NDJSON stream's first
and last lines, of an SSE stream's first event and its end). Values differ by
design (the sim's tokens are ``tok0 tok1``...), keys and statuses must not.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ALIAS = "tiny"
CHAT = [{"role": "user", "content": "Say something."}]
REPO = Path(__file__).resolve().parents[2]

# (method, path, JSON body or None). ``{rid}``: the id this server gave the POST above it.
ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/chat/completions", {"model": ALIAS, "messages": CHAT, "max_tokens": 4}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "model": ALIAS,
            "messages": CHAT,
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    ("POST", "/v1/completions", {"model": ALIAS, "prompt": "hi", "max_tokens": 4}),
    ("POST", "/v1/responses", {"model": ALIAS, "input": "hi", "max_output_tokens": 4}),
    ("GET", "/v1/responses/{rid}", None),
    ("POST", "/v1/responses/{rid}/cancel", None),
    ("POST", "/v1/messages", {"model": ALIAS, "max_tokens": 4, "messages": CHAT}),
    ("POST", "/v1/messages/count_tokens", {"model": ALIAS, "messages": CHAT}),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}),
    ("POST", "/v1/tokenize", {"model": ALIAS, "prompt": "hi"}),
    ("POST", "/v1/detokenize", {"model": ALIAS, "tokens": [1, 2, 3]}),
    ("POST", "/v1/embeddings", {"model": ALIAS, "input": "hi"}),
    ("POST", "/v1/rerank", {"model": ALIAS, "query": "a", "documents": ["b"]}),
    ("POST", "/v1/score", {"model": ALIAS, "query": "a", "items": ["b"]}),
    ("POST", "/v1/score", {"model": ALIAS, "query": "a", "items": ["b"], "label_token_ids": [1]}),
    ("POST", "/v1/classify", {"model": ALIAS, "input": "hi"}),
    ("POST", "/v1/audio/transcriptions", "multipart"),
    ("GET", "/v1/loads", None),
    ("GET", "/v1/loads?include=core", None),
    ("POST", "/api/chat", {"model": ALIAS, "messages": CHAT, "options": {"num_predict": 3}}),
    (
        "POST",
        "/api/chat",
        {
            "model": f"{ALIAS}:latest",
            "messages": CHAT,
            "stream": False,
            "options": {"num_predict": 3},
        },
    ),
    ("POST", "/api/generate", {"model": ALIAS, "prompt": "hi", "options": {"num_predict": 3}}),
    ("POST", "/api/generate", {"model": ALIAS, "prompt": "hi", "stream": False}),
    *(
        OLLAMA_LOADS := [
            ("POST", "/api/generate", {"model": ALIAS, "prompt": ""}),
            ("POST", "/api/chat", {"model": ALIAS}),
        ]
    ),
    ("POST", "/api/show", {"model": f"{ALIAS}:latest"}),
]
# Ollama's load (an empty generate or chat): the frontend answers it as Ollama does, 200
# ``done_reason: load`` once the engine is up, where SGLang generates (or refuses 400).
# Engine routes the frontend answers itself (over every configured model): real vs sim only.
ENGINE_ONLY: list[tuple[str, str, Any]] = [("GET", "/api/tags", None), ("GET", "/", None)]
# The tiny model has no audio encoder: the real server tries a generation and refuses it
# on the context (400), where an ASR model answers 200 as the sim does. Shown, not compared.
MODEL_DEPENDENT = {"/v1/audio/transcriptions"}


@dataclass(frozen=True)
class Answer:
    status: int | str
    media: str
    shape: str

    def cell(self) -> str:
        return f"{self.status} {self.media} {self.shape}"


def _keys(obj: Any) -> str:
    if isinstance(obj, dict):
        return "{" + ",".join(sorted(obj)) + "}"
    if isinstance(obj, list):
        return "[" + (_keys(obj[0]) if obj else "") + "]"
    return type(obj).__name__


def shape(media: str, text: str) -> str:
    if media == "application/x-ndjson":
        lines = [json.loads(x) for x in text.splitlines() if x]
        return f"ndjson {_keys(lines[0])} .. {_keys(lines[-1])}" if lines else "ndjson (empty)"
    if media == "text/event-stream":
        events = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
        first = _keys(json.loads(events[0])) if events else "-"
        return f"sse {first} .. {events[-1] if events else '-'}"
    try:
        return _keys(json.loads(text))
    except ValueError:
        return "text"


def answer(
    base: str,
    method: str,
    path: str,
    body: Any,
    rid: str | None,
    headers: dict[str, str] | None = None,
) -> tuple[Answer, Any]:
    """One request; returns its Answer and the decoded JSON body (for ids). ``headers``:
    the engine's key, for a ktd engine (it answers 401 without, issue 32)."""
    target = base + path.replace("{rid}", rid or "resp_none")
    kw: dict[str, Any] = {"timeout": 300, "headers": headers or {}}
    if body == "multipart":
        kw["files"] = {"file": ("a.wav", b"RIFF" + bytes(64), "audio/wav")}
        kw["data"] = {"model": ALIAS}
    elif body is not None:
        kw["json"] = body
    try:
        r = httpx.request(method, target, **kw)
    except httpx.HTTPError as exc:  # e.g. a stream the server cut
        return Answer("cut", "-", type(exc).__name__), None
    media = r.headers.get("content-type", "").split(";")[0]
    try:
        decoded = r.json()
    except ValueError:
        decoded = None
    return Answer(r.status_code, media, shape(media, r.text)), decoded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sim_like(model_dir: str, log_path: Path) -> Iterator[str]:
    """``python -m ktd.sim`` playing upstream sglang 0.5.23 with the real server's model
    flags (served name, context length 256 as the tiny model's config says)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTD_SIM_")}
    env.update(KTD_SIM_SGLANG="upstream", KTD_SIM_LOAD_TIME="0.1", KTD_SIM_WARMUP="0.05")
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "ktd.sim", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--model", model_dir, "--served-model-name", ALIAS, "--context-length", "256"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, "the sim did not become healthy"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
