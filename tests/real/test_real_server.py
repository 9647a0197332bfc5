"""ktd with the real SGLang server: load, serve through the frontend, re-adopt, evict, stop.

One daemon and one frontend for the module, engine: upstream ``sglang``
0.5.23 on this CPU with a tiny local model (``tests/real/make_model.py``);
only the two native pieces no CPU wheel has are stood in for
(``tests/real/standins``). The tests run in order and share the engine; each
step's measurement is printed (``-s`` shows it) for the closing note.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ktd.daemon.engine import proctree
from ktd.daemon.engine.key import admin_key_of_argv, key_of_argv
from tests.conftest import DaemonProc, marked_processes, wait_for
from tests.real import engine_env
from tests.real import sidebyside as sbs

ALIAS = "tiny"
CHAT = [{"role": "user", "content": "Say something."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    daemon: DaemonProc
    frontend_url: str
    frontend: Any
    env: dict[str, str]
    root: Path

    def status(self) -> dict[str, Any]:
        r = self.daemon.ktctl("status", "--json")
        assert r.returncode == 0, r.stderr
        engines: list[dict[str, Any]] = json.loads(r.stdout)["engines"]
        return next(e for e in engines if e["alias"] == ALIAS)

    def log(self) -> str:
        return (self.root / "state" / "logs" / f"{ALIAS}.log").read_text(errors="replace")

    def engine_key(self) -> str:
        """The engine's own API key: in the 0600 file its argv names (issue 32)."""
        key, path = key_of_argv(self.status()["argv"])
        assert key is not None and path is not None
        return key

    def engine_auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.engine_key()}"}

    def admin_auth(self) -> dict[str, str]:
        """What SGLang's admin-level routes want: the admin key ktd gives every engine
        (issue 40), in the same 0600 file; the API key cannot call them."""
        return {"authorization": f"Bearer {admin_key_of_argv(self.status()['argv'])}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.frontend_url}/v1", api_key="none", timeout=300)


def tree_of(pid: int) -> set[tuple[int, int]]:
    procs = proctree.all_procs()
    root = procs[pid]
    return {(root.pid, root.start)} | {(d.pid, d.start) for d in proctree.descendants(pid, procs)}


@pytest.fixture(scope="module")
def stack(venv_python: Any, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One real stack for the module. Its directory (config, logs) is removed at the
    end unless a test failed meanwhile: then its logs are what to read."""
    import subprocess
    import sys

    failed_before = request.session.testsfailed
    root = Path(tempfile.mkdtemp(prefix="ktd-real-", dir="/tmp"))
    models = [
        {
            "path": engine_env.model_dir(),
            "backend": "kt",
            "alias": ALIAS,  # numa unset: "auto", the default config
            "kt": {
                "extra_args": engine_env.ENGINE_FLAGS,
                "extra_env": engine_env.engine_env(base={}),
            },
        }
    ]
    daemon_settings = {"stop_grace": 60, "drain_timeout": 30, "health_interval": 2}
    frontend_settings = {"load_timeout": 600, "read_timeout": 300}
    config, env = engine_env.ktd_config(
        root, venv_python(), models, daemon_settings, frontend_settings
    )
    daemon = DaemonProc(config=Path(config), env=env, log_path=root / "ktd.log").start()
    port = free_port()
    fe_log = open(root / "frontend.log", "ab")  # noqa: SIM115
    frontend = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ktd",
            "frontend",
            "--config",
            config,
            "--bind",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=fe_log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    fe_log.close()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(url), timeout=30, what="the frontend")
    try:
        yield Stack(daemon, url, frontend, env, root)
    finally:
        frontend.send_signal(signal.SIGTERM)
        frontend.wait(30)
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop(timeout=120)
        if request.session.testsfailed == failed_before:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nthe real stack's logs are kept in {root}")


def _up(url: str) -> bool:
    try:
        httpx.get(url + "/metrics", timeout=2)
    except httpx.HTTPError:
        return False
    return True


MEASURED: dict[str, float] = {}


def test_default_config_loads_to_ready(stack: Stack) -> None:
    """numa unset (auto): upstream has no --kt-numa-nodes, so ktd leaves it out, pins by
    affinity, and says so; the engine becomes ready (/v1/models and /health both)."""
    t0 = time.monotonic()
    r = stack.daemon.ktctl("load", ALIAS, "--json", "--timeout", "600", timeout=660)
    MEASURED["load_s"] = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr + stack.log()[-3000:]
    e = stack.status()
    assert e["state"] == "ready" and e["pid"]
    argv = e["argv"]
    assert "--kt-numa-nodes" not in argv
    assert "--kt-threadpool-count" in argv and "--kt-cpuinfer" in argv
    assert e["sglang"] == "sglang 0.5.23"
    assert any("--kt-numa-nodes left out" in n for n in e["notes"])
    plan = json.loads(stack.daemon.ktctl("load", "--dry-run", "--json", ALIAS).stdout)["plan"]
    assert any("--kt-numa-nodes left out" in n for n in plan["notes"])
    print(f"\nreal SGLang: ktctl load -> ready in {MEASURED['load_s']:.1f}s")


def test_the_engine_answers_only_with_its_key(stack: Stack) -> None:
    """Issue 32: the real server ktd started reads its key from the 0600 ``--config`` file
    (never on a command line) and answers 401 without it; ``/health`` and ``/metrics``
    stay open (SGLang's middleware), ktd's probes and the frontend carry the key, and
    the key shows nowhere ktd shows the engine (status, logs, the log file)."""
    e = stack.status()
    key, path = key_of_argv(e["argv"])
    assert key is not None and path is not None
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    url = e["url"]
    denied = httpx.get(f"{url}/v1/models", timeout=10)
    assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"})
    wrong = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    chat = {"model": ALIAS, "messages": CHAT, "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=stack.engine_auth(), timeout=10).status_code == 200
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200
    assert httpx.get(f"{url}/metrics", timeout=10).status_code != 401
    for pid in {m[0] for m in tree_of(e["pid"])}:
        assert key not in " ".join(proctree.cmdline(pid))
    assert key not in stack.daemon.ktctl("status", "--json").stdout
    logs = stack.daemon.ktctl("logs", ALIAS, "-n", "2000").stdout
    assert key not in logs and key not in stack.log()
    masked = "*" * len(key)
    print(f"\nreal SGLang with its key: 401 without; the log shows it masked: {masked in logs}")


def test_openai_stream_through_the_frontend_with_usage(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model=ALIAS,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_real_frontend_and_sim_answer_every_proxied_route_alike(stack: Stack) -> None:
    """Every route the frontend proxies, sent to the real engine, through the frontend, and
    to the sim (playing upstream 0.5.23): printed side by side; the frontend answers as the
    engine does (Ollama's load excepted: as Ollama does), and the sim as the real server
    does (status, media type, keys)."""
    engine = stack.status()["url"]
    auth = stack.engine_auth()
    rows: list[tuple[str, sbs.Answer, sbs.Answer | None, sbs.Answer]] = []
    with sbs.sim_like(engine_env.model_dir(), stack.root / "sim.log") as sim:
        rids: dict[str, str | None] = {}
        ollama_loads: list[bool] = []
        for method, path, body in [*sbs.ROUTES, *sbs.ENGINE_ONLY]:
            got: dict[str, sbs.Answer | None] = {}
            for name, base in (("real", engine), ("frontend", stack.frontend_url), ("sim", sim)):
                if name == "frontend" and (method, path, body) in sbs.ENGINE_ONLY:
                    got[name] = None
                    continue
                headers = auth if name == "real" else None
                got[name], decoded = sbs.answer(base, method, path, body, rids.get(name), headers)
                if path == "/v1/responses" and isinstance(decoded, dict):
                    rids[name] = decoded.get("id")
            real, fe, sim_got = got["real"], got["frontend"], got["sim"]
            assert real is not None and sim_got is not None
            rows.append((f"{method} {path}", real, fe, sim_got))
            ollama_loads.append((method, path, body) in sbs.OLLAMA_LOADS)
    width = max(len(r[0]) for r in rows)
    lines = [f"{'route'.ljust(width)}  real | frontend | sim"]
    for route, real, fe, sim_got in rows:
        lines.append(f"{route.ljust(width)}  {real.cell()}")
        lines.append(f"{''.ljust(width)}  frontend: {fe.cell() if fe else '(answered by ktd)'}")
        lines.append(f"{''.ljust(width)}  sim:      {sim_got.cell()}")
    print("\nreal SGLang 0.5.23 | through ktd's frontend | ktd.sim:\n  " + "\n  ".join(lines))
    for (route, real, fe, sim_got), load in zip(rows, ollama_loads, strict=True):
        if load:
            assert fe is not None and (fe.status, fe.media) == (200, "application/json"), fe
            assert "done_reason" in fe.shape, fe
        elif fe is not None:
            assert fe.status == real.status, (route, real, fe)
        if route.split()[1] not in sbs.MODEL_DEPENDENT:
            assert (sim_got.status, sim_got.media, sim_got.shape) == (
                real.status, real.media, real.shape,
            ), route  # fmt: skip
    ok = {r[0] for r in rows if r[2] is not None and r[2].status == 200}
    for must in ("POST /v1/responses", "POST /v1/messages", "POST /generate",
                 "POST /api/chat", "POST /api/generate", "GET /v1/loads"):  # fmt: skip
        assert must in ok, rows


def test_official_ollama_client_through_the_frontend(stack: Stack) -> None:
    """The ``ollama`` client on ktd's frontend, the real SGLang behind it."""
    import ollama

    client = ollama.Client(host=stack.frontend_url, timeout=300)
    assert [m.model for m in client.list().models] == [f"{ALIAS}:latest"]
    chat = client.chat(model=f"{ALIAS}:latest", messages=CHAT, options={"num_predict": 4})
    assert chat.done and chat.eval_count is not None and 1 <= chat.eval_count <= 4
    parts = list(client.chat(model=ALIAS, messages=CHAT, options={"num_predict": 4}, stream=True))
    assert parts[-1].done and parts[-1].done_reason == "stop" and 1 <= len(parts) <= 4
    gen = client.generate(model=ALIAS, prompt="hi", options={"num_predict": 3})
    assert gen.done and gen.eval_count is not None and gen.eval_count <= 3
    streamed = list(
        client.generate(model=ALIAS, prompt="hi", options={"num_predict": 3}, stream=True)
    )
    assert streamed[-1].done
    assert "PARAMETER num_ctx 256" in (client.show(f"{ALIAS}:latest").modelfile or "")
    (running,) = client.ps().models
    assert running.model == f"{ALIAS}:latest" and running.context_length == 256
    assert running.expires_at is not None and running.expires_at.year > 2200  # no TTL: Forever
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3")
    assert err.value.status_code == 501
    print(f"\nreal SGLang via ollama client: chat {chat.message.content!r}, {len(parts)} parts")


def test_sdks_through_the_frontend(stack: Stack) -> None:
    """The official openai (responses, models.retrieve) and anthropic SDKs, streaming too."""
    import anthropic

    client = stack.client()
    assert client.models.retrieve(ALIAS).id == ALIAS
    resp = client.responses.create(model=ALIAS, input="hi", max_output_tokens=4)
    assert resp.status in ("completed", "incomplete")
    claude = anthropic.Anthropic(base_url=stack.frontend_url, api_key="none", timeout=300)
    msg = claude.messages.create(model=ALIAS, max_tokens=4, messages=CHAT)  # type: ignore[arg-type]
    assert msg.content and msg.model == ALIAS
    with claude.messages.stream(model=ALIAS, max_tokens=4, messages=CHAT) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
    assert isinstance(text, str) and stream.get_final_message().usage.output_tokens >= 1


def test_overlong_prompt_400_reaches_the_client_as_sglang_sent_it(stack: Stack) -> None:
    words = " ".join(f"w{i}" for i in range(2000))
    body = {"model": ALIAS, "messages": [{"role": "user", "content": words}], "max_tokens": 4}
    with pytest.raises(openai.BadRequestError) as err:
        stack.client().chat.completions.create(**body)  # type: ignore[call-overload]
    assert "longer than the model's context length" in str(err.value)
    engine_url = stack.status()["url"]
    direct = httpx.post(
        f"{engine_url}/v1/chat/completions",
        json={**body, "stream": True},
        headers=stack.engine_auth(),
    )
    proxied = httpx.post(
        f"{stack.frontend_url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    )
    assert direct.status_code == proxied.status_code == 400
    # SGLang's own error, in the shape OpenAI clients read: its message, type and code.
    sglang = direct.json()
    assert sglang["object"] == "error"
    assert proxied.json() == {
        "error": {k: sglang.get(k) for k in ("message", "type", "param", "code")}
    }


def test_the_memory_api_answers_as_the_sim_says_and_serves_after_a_resume(stack: Stack) -> None:
    """SGLang's sleep calls, on the real server (no --enable-memory-saver here: on a CPU
    the saver cannot start, so nothing is freed) and on the sim playing it: the same
    status and body; after the resume the real server still generates."""
    engine = stack.status()["url"]
    admin = stack.admin_auth()  # the memory API is admin-level
    body = {"tags": ["weights", "kv_cache", "cuda_graph"]}
    got: dict[str, list[tuple[int, str, float]]] = {}
    with sbs.sim_like(engine_env.model_dir(), stack.root / "sim-memory.log") as sim:
        for name, base in (("real", engine), ("sim", sim)):
            got[name] = []
            for path in ("/release_memory_occupation", "/resume_memory_occupation"):
                t0 = time.monotonic()
                r = httpx.post(base + path, json=body, timeout=120, headers=admin)
                got[name].append((r.status_code, r.text, time.monotonic() - t0))
            # No body: FastAPI's validation error, nothing released (a resume now would
            # kill the server: the scheduler removes tags that are not in its offload set).
            missing = httpx.post(base + "/release_memory_occupation", timeout=30, headers=admin)
            got[name].append((missing.status_code, "", 0.0))
    print(f"\nmemory API: real {got['real']}\n            sim  {got['sim']}")
    assert [(c, t) for c, t, _ in got["real"]] == [(c, t) for c, t, _ in got["sim"]]
    assert got["real"][0][:2] == (200, "null") and got["real"][1][:2] == (200, "null")
    reply = stack.client().chat.completions.create(
        model=ALIAS,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=4,
    )
    assert reply.choices[0].message.content is not None


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scheduler_pid(engine_pid: int) -> int:
    for child in proctree.descendants(engine_pid, proctree.all_procs()):
        if "sglang::scheduler" in Path(f"/proc/{child.pid}/cmdline").read_text(errors="replace"):
            return child.pid
        comm = Path(f"/proc/{child.pid}/comm").read_text().strip()
        if comm.startswith("sglang::schedul"):
            return child.pid
    raise AssertionError("no sglang::scheduler under the engine")


def test_the_door_holds_generations_and_health_and_the_scheduler_proves_idle(
    stack: Stack,
) -> None:
    """Issue 40's fence on the real server, the sim beside it: ``/pause_generation``
    (abort) answers as the sim does; a generation sent meanwhile is held before the
    scheduler (``/v1/loads`` counts nothing, ``/flush_cache`` says idle) and runs after
    ``/continue_generation``; ``/health`` waits at the door and answers 503 after its
    timeout (it never reaches the scheduler); ``/v1/loads`` gives each rank's
    ``timestamp`` and ``num_used_tokens``. The abort pause leaves the scheduler idle,
    the retract pause makes its loop spin (measured: CPU seconds over the same window)."""
    status = stack.status()
    engine, auth, admin = status["url"], stack.engine_auth(), stack.admin_auth()
    answers: dict[str, list[tuple[int, str]]] = {}
    with sbs.sim_like(engine_env.model_dir(), stack.root / "sim-door.log") as sim:
        for name, base in (("real", engine), ("sim", sim)):
            got = answers[name] = []
            r = httpx.post(base + "/pause_generation", json={"mode": "abort"}, headers=admin)
            got.append((r.status_code, r.text))
            held: list[httpx.Response] = []

            def send(base: str = base, held: list[httpx.Response] = held) -> None:
                body = {"model": ALIAS, "messages": CHAT, "max_tokens": 2}
                held.append(
                    httpx.post(base + "/v1/chat/completions", json=body, headers=auth, timeout=120)
                )

            t = threading.Thread(target=send)
            t.start()
            time.sleep(1.0)  # not a bound: what is asserted is that nothing ran meanwhile
            load = httpx.get(base + "/v1/loads?include=core", headers=auth).json()["loads"][0]
            assert load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0, load
            assert isinstance(load["timestamp"], float) and "num_used_tokens" in load
            assert not held, "a generation went through the closed door"
            flush = httpx.post(base + "/flush_cache", headers=admin, timeout=30)
            got.append((flush.status_code, flush.text))
            r = httpx.post(base + "/continue_generation", json={}, headers=admin)
            got.append((r.status_code, r.text))
            t.join(120)
            assert held and held[0].status_code == 200, held
        print(f"\nthe door: real {answers['real']}\n          sim  {answers['sim']}")
        assert answers["real"] == answers["sim"]
    # /health at a closed door: held, then SGLang's health check gives up (503).
    httpx.post(engine + "/pause_generation", json={"mode": "abort"}, headers=admin)
    t0 = time.monotonic()
    health = httpx.get(engine + "/health", timeout=120)
    waited = time.monotonic() - t0
    MEASURED["health_at_closed_door_s"] = waited
    assert health.status_code == 503 and waited >= 19, (health.status_code, waited)
    # Does the pause spin the scheduler? The same window, idle behind an abort pause and
    # behind a retract pause.
    sched = _scheduler_pid(status["pid"])
    cpu: dict[str, float] = {}
    for mode in ("abort", "retract"):
        httpx.post(engine + "/pause_generation", json={"mode": mode}, headers=admin)
        c0 = _cpu_seconds(sched)
        time.sleep(3.0)
        cpu[mode] = _cpu_seconds(sched) - c0
        httpx.post(engine + "/continue_generation", json={}, headers=admin)
    MEASURED.update({f"scheduler_cpu_3s_{k}": v for k, v in cpu.items()})
    print(f"scheduler CPU seconds over 3 s paused: {cpu}")
    assert cpu["retract"] > 3 * cpu["abort"] + 0.3, cpu
    assert httpx.get(engine + "/health", timeout=60).status_code == 200  # open again


def test_kill9_of_ktd_then_restart_readopts_the_same_engine(stack: Stack) -> None:
    before = stack.status()
    assert stack.daemon.proc is not None
    stack.daemon.proc.send_signal(signal.SIGKILL)
    stack.daemon.proc.wait(30)
    assert proctree.alive((before["pid"], proctree.read_stat(before["pid"]).start))  # type: ignore[union-attr]
    stack.daemon.start()
    wait_for(lambda: stack.status()["state"] == "ready", timeout=120, what="re-adopted and ready")
    assert stack.status()["pid"] == before["pid"]
    assert key_of_argv(stack.status()["argv"]) == key_of_argv(before["argv"])  # its file kept
    reply = stack.client().chat.completions.create(
        model=ALIAS,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=4,
    )
    assert reply.choices[0].message.content is not None


def test_evict_is_sglangs_own_clean_shutdown(stack: Stack) -> None:
    e = stack.status()
    members = tree_of(e["pid"])
    assert len(members) >= 3  # the server + scheduler + detokenizer (+ resource tracker)
    log_before = len(stack.log())
    gone: dict[str, float] = {}

    def watch() -> None:  # when the last process of the engine is gone (SGLang's own part)
        while any(proctree.alive(m) for m in members):
            time.sleep(0.005)
        gone["t"] = time.monotonic()

    watcher = threading.Thread(target=watch)
    t0 = time.monotonic()
    watcher.start()
    key_file = key_of_argv(e["argv"])[1]
    r = stack.daemon.ktctl("evict", ALIAS, "--json", timeout=180)
    MEASURED["evict_s"] = time.monotonic() - t0
    watcher.join(10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert key_file is not None and not key_file.exists()  # the key went with the engine
    assert not [m for m in members if proctree.alive(m)]
    assert proctree.port_free("127.0.0.1", e["port"])
    log = stack.log()[log_before:]
    assert "SIGTERM received" in log and "stopped cleanly by SIGTERM" in log
    for bad in ("crashed", "SIGQUIT", "SIGKILL to"):
        assert bad not in log, log[-3000:]
    assert stack.status()["state"] == "stopped"
    own = gone["t"] - t0
    print(
        f"\nreal SGLang: ktctl evict (idle) took {MEASURED['evict_s']:.2f}s; SGLang's own "
        f"shutdown {own:.2f}s; ktd's part after the last process was gone "
        f"{MEASURED['evict_s'] - own:.3f}s"
    )


def test_sigterm_of_ktd_leaves_nothing(stack: Stack) -> None:
    r = stack.daemon.ktctl("load", ALIAS, "--json", "--timeout", "600", timeout=660)
    assert r.returncode == 0, r.stdout + r.stderr
    e = stack.status()
    members = tree_of(e["pid"])
    assert stack.daemon.stop(timeout=120) == 0
    assert not [m for m in members if proctree.alive(m)]
    engines = [(pid, cmd) for pid, cmd in marked_processes() if "ktd" not in " ".join(cmd[:3])]
    assert not [p for p in engines if "sglang" in " ".join(p[1])]
    assert proctree.port_free("127.0.0.1", e["port"])
