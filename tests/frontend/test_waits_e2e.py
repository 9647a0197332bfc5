"""Clients that wait know why and for how long (issue 46): real ``ktd serve`` + ``ktd
frontend`` + sim engines, one shared stack.

A stream that waits carries ``ktd.progress`` events (phase, place in the model's line,
ETA) before its answer; a request that is not streamed is found by its ``X-Request-Id``
on ``/v1/ktd/requests``; ``ktctl status`` shows each model's queue and its oldest wait.
Nothing depends on a timing margin: the engine that keeps the others in line holds its
stream until the test opens the sim's gate, and each wait is seen, not slept for.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import sim_model, wait_for
from tests.stack import Stack, StackFactory

CHAT: Any = [{"role": "user", "content": "hi"}]
RAW = Path(os.environ.get("KTD_WAITS_RAW", "/nonexistent"))  # where a test leaves its raw streams


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory) -> Stack:
    return stack_factory(
        [
            # Wakes in a second and a half: long enough for a stream to see it.
            sim_model("wk", sleep=True, env={"KTD_SIM_RESUME_TIME": 1.5}),
            # One request at a time, held until the test opens the gate.
            sim_model("q", max_concurrent=1, env={"KTD_SIM_HOLD": 1}),
            # A load of two seconds: its history makes the next load's ETA.
            sim_model("eta", env={"KTD_SIM_LOAD_TIME": 2.0}),
        ],
        frontend={"keys": [
            {"name": "alice", "key": "ka"},
            {"name": "bob", "key": "kb", "progress": "reasoning"},
            {"name": "root", "key": "kr", "admin": True},
        ]},
    )  # fmt: skip


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def events_of(raw: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event with data; comments dropped."""
    out = []
    for block in raw.split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def progress_of(raw: str) -> list[dict[str, Any]]:
    return [json.loads(d)["ktd_progress"] for n, d in events_of(raw) if n == "ktd.progress"]


def open_gate(stack: Stack, alias: str) -> None:
    port = stack.daemon.engines()[alias]["port"]
    httpx.post(f"http://127.0.0.1:{port}/sim/gate", json={"open": True}, timeout=30)


def keep(name: str, raw: str) -> None:
    """The raw stream, for the issue's closing note (``KTD_WAITS_RAW=dir``)."""
    if RAW.is_dir():
        (RAW / name).write_text(raw)


class Streamer(threading.Thread):
    """One streamed chat request in a thread: its raw bytes as they come."""

    def __init__(self, url: str, model: str, key: str, **headers: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.headers = {**auth(key), **headers}
        self.raw = ""
        self.status = 0
        self.error: BaseException | None = None
        self.hang_up = threading.Event()

    def run(self) -> None:
        body = {"model": self.model, "messages": CHAT, "max_tokens": 3, "stream": True}
        try:
            with (
                httpx.Client(timeout=60) as c,
                c.stream(
                    "POST", self.url + "/v1/chat/completions", json=body, headers=self.headers
                ) as r,
            ):
                self.status = r.status_code
                for chunk in r.iter_text():
                    self.raw += chunk
                    if self.hang_up.is_set():
                        return
        except BaseException as exc:
            self.error = exc


def waiting(stack: Stack, key: str = "kr") -> list[dict[str, Any]]:
    r = httpx.get(stack.url + "/v1/ktd/requests", headers=auth(key), timeout=10)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_a_stream_sees_queued_then_waking_then_its_answer(stack: Stack) -> None:
    with stack.daemon.client() as c:
        c.load("wk")
        c.sleep("wk")
    s = Streamer(stack.url, "wk", "ka")
    s.run()
    assert s.error is None and s.status == 200, (s.error, s.raw)
    keep("wake.txt", s.raw)
    events = events_of(s.raw)
    phases = [json.loads(d)["ktd_progress"]["phase"] for n, d in events if n == "ktd.progress"]
    first_answer = next(i for i, (n, _) in enumerate(events) if n is None)
    # Every progress event comes before the answer's first chunk, in order.
    assert all(n == "ktd.progress" for n, _ in events[:first_answer])
    assert phases[0] == "queued" and "waking" in phases, phases
    assert phases.index("waking") > 0
    answer = [json.loads(d) for n, d in events[first_answer:] if n is None and d != "[DONE]"]
    assert any(ch["choices"] and ch["choices"][0]["delta"].get("content") for ch in answer)
    # The progress never reaches the answer's content, and the key did not ask for it as
    # reasoning: its chunks have no choice at all.
    assert all(json.loads(d)["choices"] == [] for n, d in events if n == "ktd.progress")


def test_positions_move_up_when_a_waiting_client_hangs_up(stack: Stack) -> None:
    with stack.daemon.client() as c:
        c.load("q")
    holder = Streamer(stack.url, "q", "ka")
    holder.start()
    wait_for(lambda: "data: {" in holder.raw, what="the held stream's first token")
    line = [Streamer(stack.url, "q", "ka", **{"X-Request-Id": f"r{i}"}) for i in range(3)]
    for i, s in enumerate(line):
        s.start()
        wait_for(lambda n=i + 1: len(waiting(stack)) == n, what=f"{i + 1} waiting")
    by_id = {w["request_id"]: w for w in waiting(stack)}
    assert [by_id[f"r{i}"]["position"] for i in range(3)] == [1, 2, 3]
    assert all(w["phase"] == "queued" and w["queued"] == 3 for w in by_id.values())
    # The third waits behind two others: its own stream says so.
    wait_for(lambda: any(p["ahead"] == 2 for p in progress_of(line[2].raw)), what="ahead 2")
    # ktctl status: the model's queue and its oldest wait.
    shown = stack.daemon.ktctl("status").stdout
    row = next(ln for ln in shown.splitlines() if ln.startswith("q "))
    assert "3, " in row, shown  # three waiting, and for how long
    # The second hangs up: it leaves the line at once, the third moves up.
    line[1].hang_up.set()
    wait_for(lambda: len(waiting(stack)) == 2, what="the hung-up client out of the line")
    by_id = {w["request_id"]: w for w in waiting(stack)}
    assert {k: w["position"] for k, w in by_id.items()} == {"r0": 1, "r2": 2}
    wait_for(lambda: progress_of(line[2].raw)[-1]["position"] == 2, what="r2 told it moved up")
    open_gate(stack, "q")
    for s in (holder, line[0], line[2]):
        s.join(30)
        assert s.error is None and s.raw.rstrip().endswith("data: [DONE]"), s.raw
    keep("queue.txt", line[2].raw)
    assert waiting(stack) == []


def test_a_request_that_is_not_streamed_is_looked_up_by_its_id(stack: Stack) -> None:
    with stack.daemon.client() as c:
        c.load("q")
    holder = Streamer(stack.url, "q", "ka")
    holder.start()
    wait_for(lambda: "data: {" in holder.raw, what="the held stream's first token")
    out: list[httpx.Response] = []
    body = {"model": "q", "messages": CHAT, "max_tokens": 2}

    def plain() -> None:
        headers = {**auth("kb"), "X-Request-Id": "bob-1"}
        out.append(
            httpx.post(stack.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        )

    t = threading.Thread(target=plain, daemon=True)
    t.start()
    wait_for(lambda: len(waiting(stack)) == 1, what="bob's request waiting")
    got = httpx.get(stack.url + "/v1/ktd/requests/bob-1", headers=auth("kb"), timeout=10)
    assert got.status_code == 200, got.text
    doc = got.json()
    assert (doc["phase"], doc["position"], doc["model"], doc["stream"]) == ("queued", 1, "q", False)
    # Another key sees neither it nor it in its list; an admin key sees it.
    other = httpx.get(stack.url + "/v1/ktd/requests/bob-1", headers=auth("ka"), timeout=10)
    assert other.status_code == 404 and other.json()["error"]["code"] == "request_not_waiting"
    assert waiting(stack, "ka") == []
    assert [w["request_id"] for w in waiting(stack, "kr")] == ["bob-1"]
    assert httpx.get(stack.url + "/v1/ktd/requests", timeout=10).status_code == 401
    open_gate(stack, "q")
    t.join(30)
    holder.join(30)
    assert out and out[0].status_code == 200, out
    gone = httpx.get(stack.url + "/v1/ktd/requests/bob-1", headers=auth("kb"), timeout=10)
    assert gone.status_code == 404
    metrics = httpx.get(stack.url + "/metrics", headers=auth("kr"), timeout=10).text
    assert 'ktd_frontend_wait_seconds_count{model="q",phase="queued"}' in metrics


def test_reasoning_progress_for_a_key_that_asks_and_a_header(stack: Stack) -> None:
    # bob's key asks for reasoning; alice asks with the header. Both wait for a load.
    bob = Streamer(stack.url, "eta", "kb")
    alice = Streamer(stack.url, "eta", "ka", **{"X-Ktd-Progress": "reasoning"})
    plain = Streamer(stack.url, "eta", "ka")
    for s in (bob, alice, plain):
        s.start()
    for s in (bob, alice, plain):
        s.join(30)
        assert s.error is None and s.status == 200, s.error
    for s in (bob, alice):
        chunks = [json.loads(d) for n, d in events_of(s.raw) if n == "ktd.progress"]
        deltas = [ch["choices"][0]["delta"] for ch in chunks]
        assert deltas and all("content" not in d for d in deltas)
        assert any("loading eta" in d["reasoning_content"] for d in deltas), deltas
    assert all(
        json.loads(d)["choices"] == [] for n, d in events_of(plain.raw) if n == "ktd.progress"
    )


def test_the_load_eta_is_within_twice_what_happened(stack: Stack) -> None:
    with stack.daemon.client() as c:
        c.load("eta")  # the load history: one load of ~2 s
        c.evict("eta")
    wait_for(lambda: stack.daemon.engines()["eta"]["state"] == "stopped", what="eta stopped")
    started = time.monotonic()
    s = Streamer(stack.url, "eta", "ka")
    s.start()
    seen: list[dict[str, Any]] = []

    def a_loading_eta() -> bool:
        seen[:] = [p for p in progress_of(s.raw) if p["phase"] == "loading" and p["eta"]]
        return bool(seen)

    wait_for(a_loading_eta, what="a loading event with an ETA")
    told_at = started + seen[0]["waited"]
    predicted = seen[0]["eta"]
    wait_for(lambda: '"content"' in s.raw, what="the first token")
    happened = time.monotonic() - told_at
    s.join(30)
    keep("load.txt", s.raw)
    assert happened / 2 <= predicted <= happened * 2, (predicted, happened)
    print(
        f"ETA {predicted:.1f}s told at {seen[0]['waited']:.1f}s; the first token came "
        f"{happened:.2f}s later"
    )


# ---------------------------------------------------------------- the official clients


def tee(http: Any) -> Any:
    """A transport of ``http`` (httpx, or anthropic's httpx2) that keeps the bytes an
    official client received, as it received them (the SDK reads the same stream: what
    it makes of the progress events is the SDK's own code)."""

    class Tee(http.HTTPTransport):  # type: ignore[misc,name-defined]
        seen = b""

        def handle_request(self, request: Any) -> Any:
            response = super().handle_request(request)
            inner, kept = response.stream, self

            class Stream(http.SyncByteStream):  # type: ignore[misc,name-defined]
                def __iter__(self) -> Any:
                    for chunk in inner:
                        kept.seen += chunk
                        yield chunk

                def close(self) -> None:
                    inner.close()

            response.stream = Stream()
            return response

    return Tee()


def hold_q(stack: Stack) -> Streamer:
    """``q`` loaded and its one slot held: whatever comes next waits in its line."""
    with stack.daemon.client() as c:
        c.load("q")
    holder = Streamer(stack.url, "q", "ka")
    holder.start()
    wait_for(lambda: "data: {" in holder.raw, what="the held stream's first token")
    return holder


def test_the_python_clients_stream_through_progress_events(stack: Stack) -> None:
    import anthropic
    import httpx2
    import ollama
    import openai

    holder = hold_q(stack)
    tees = {name: tee(httpx) for name in ("chat", "helper", "completions", "ollama")}
    tees.update({name: tee(httpx2) for name in ("messages", "mhelper")})

    def oa(name: str) -> openai.OpenAI:
        http = httpx.Client(transport=tees[name], timeout=60)
        return openai.OpenAI(
            base_url=stack.url + "/v1", api_key="ka", max_retries=0, http_client=http
        )

    def an(name: str) -> anthropic.Anthropic:
        http = httpx2.Client(transport=tees[name], timeout=60)
        return anthropic.Anthropic(
            base_url=stack.url, api_key="ka", max_retries=0, http_client=http
        )

    def chat() -> str:
        stream = oa("chat").chat.completions.create(
            model="q", messages=CHAT, max_tokens=3, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def helper() -> str:
        # No max_tokens: the helper refuses an answer cut by the length limit.
        with oa("helper").chat.completions.stream(model="q", messages=CHAT) as s:
            for _ in s:
                pass
            return s.get_final_completion().choices[0].message.content or ""

    def completions() -> str:
        stream = oa("completions").completions.create(
            model="q", prompt="hi", max_tokens=3, stream=True
        )
        return "".join(c.choices[0].text for c in stream if c.choices)

    def messages() -> str:
        stream = an("messages").messages.create(model="q", messages=CHAT, max_tokens=3, stream=True)
        return "".join(
            e.delta.text
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )

    def mhelper() -> str:
        with an("mhelper").messages.stream(model="q", messages=CHAT, max_tokens=3) as s:
            block = s.get_final_message().content[0]
            return block.text if block.type == "text" else ""

    def chat_ollama() -> str:
        client = ollama.Client(host=stack.url, transport=tees["ollama"], headers=auth("ka"))
        parts = client.chat(model="q", messages=CHAT, stream=True, options={"num_predict": 3})
        return "".join(p.message.content or "" for p in parts)

    calls = {
        "chat": chat,
        "helper": helper,
        "completions": completions,
        "messages": messages,
        "mhelper": mhelper,
        "ollama": chat_ollama,
    }
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = calls[name]()
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in calls]
    for t in threads:
        t.start()
    sse = ("chat", "helper", "completions", "messages", "mhelper")
    try:
        wait_for(lambda: all(b"ktd_progress" in tees[n].seen for n in sse), what="progress")
    except AssertionError:
        raise AssertionError(f"{[(n, tees[n].seen[:300]) for n in sse]} {results}") from None
    wait_for(lambda: len(waiting(stack)) == len(calls), what="every client waiting")
    open_gate(stack, "q")
    for t in threads:
        t.join(60)
    holder.join(30)
    bad = {k: r for k, r in results.items() if not (isinstance(r, str) and r)}
    assert not bad, bad
    for name in ("chat", "helper", "completions"):
        assert b"event: ktd.progress\ndata: {" in tees[name].seen
    for name in ("messages", "mhelper"):
        assert b'event: ping\ndata: {"type":"ping","ktd_progress":' in tees[name].seen
    assert b"ktd_progress" not in tees["ollama"].seen  # NDJSON: nothing of ktd's


NODE_PACKAGES = ("openai@6.49.0", "ollama@0.6.4", "@anthropic-ai/sdk@1.17.0")

NODE_SCRIPT = r"""
const OpenAI = require("openai");
const Anthropic = require("@anthropic-ai/sdk");
const { Ollama } = require("ollama");
const [url, gate] = process.argv.slice(1);
const seen = { chat: "", helper: "", messages: "", mhelper: "", ollama: "" };
function tee(name) {
  return async (u, init) => {
    const r = await fetch(u, init);
    if (!r.body) return r;
    const [a, b] = r.body.tee();
    (async () => {
      const rd = b.getReader(), dec = new TextDecoder();
      for (;;) {
        const { done, value } = await rd.read();
        if (done) break;
        seen[name] += dec.decode(value, { stream: true });
      }
    })();
    return new Response(a, { status: r.status, statusText: r.statusText, headers: r.headers });
  };
}
const msgs = [{ role: "user", content: "hi" }];
const oa = (n) => new OpenAI({ baseURL: url + "/v1", apiKey: "ka", maxRetries: 0, fetch: tee(n) });
const an = (n) => new Anthropic({ baseURL: url, apiKey: "ka", maxRetries: 0, fetch: tee(n) });
const jobs = {
  chat: async () => {
    let t = "";
    const s = await oa("chat").chat.completions.create(
      { model: "q", messages: msgs, max_tokens: 3, stream: true });
    for await (const c of s) if (c.choices.length) t += c.choices[0].delta.content ?? "";
    return t;
  },
  helper: async () => {
    const s = oa("helper").chat.completions.stream({ model: "q", messages: msgs });
    return (await s.finalChatCompletion()).choices[0].message.content;
  },
  messages: async () => {
    let t = "";
    const s = await an("messages").messages.create(
      { model: "q", messages: msgs, max_tokens: 3, stream: true });
    for await (const e of s) if (e.type === "content_block_delta") t += e.delta.text;
    return t;
  },
  mhelper: async () => {
    const m = await an("mhelper").messages.stream(
      { model: "q", messages: msgs, max_tokens: 3 }).finalMessage();
    return m.content[0].text;
  },
  ollama: async () => {
    let t = "";
    const o = new Ollama(
      { host: url, fetch: tee("ollama"), headers: { Authorization: "Bearer ka" } });
    const s = await o.chat(
      { model: "q", messages: msgs, stream: true, options: { num_predict: 3 } });
    for await (const p of s) t += p.message.content;
    return t;
  },
};
(async () => {
  const running = {};
  for (const [k, f] of Object.entries(jobs))
    running[k] = f().then(
      (v) => ({ ok: true, text: v }),
      (e) => ({ ok: false, error: String((e && e.stack) || e) }));
  const sse = ["chat", "helper", "messages", "mhelper"];
  const deadline = Date.now() + 30000;
  while (!sse.every((n) => seen[n].includes("ktd_progress")) && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 50));
  await fetch(gate, { method: "POST", body: JSON.stringify({ open: true }),
                      headers: { "content-type": "application/json" } });
  const out = { seen };
  for (const k of Object.keys(running)) out[k] = await running[k];
  console.log(JSON.stringify(out));
})();
"""


@pytest.fixture(scope="module")
def node_modules() -> Path:
    import shutil
    import subprocess

    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed (apt-get install -y nodejs npm)"
    root = Path(os.environ.get("KTD_NODE_CACHE", Path.home() / ".cache" / "ktd-node"))
    prefix = root / "-".join(p.replace("@", "").replace("/", "-") for p in NODE_PACKAGES)
    if not (prefix / "node_modules" / "@anthropic-ai" / "sdk" / "package.json").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        flags = ("--no-audit", "--no-fund")
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), *flags, *NODE_PACKAGES],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return prefix / "node_modules"


def test_the_node_clients_stream_through_progress_events(stack: Stack, node_modules: Path) -> None:
    import subprocess

    holder = hold_q(stack)
    port = stack.daemon.engines()["q"]["port"]
    ran = subprocess.run(
        ["node", "-e", NODE_SCRIPT, stack.url, f"http://127.0.0.1:{port}/sim/gate"],
        env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    holder.join(30)
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    seen = got.pop("seen")
    for name, result in got.items():
        assert result["ok"] and result["text"], (name, result)
    for name in ("chat", "helper"):
        assert "event: ktd.progress\ndata: {" in seen[name], seen[name]
    for name in ("messages", "mhelper"):
        assert 'event: ping\ndata: {"type":"ping","ktd_progress":' in seen[name], seen[name]
    assert "ktd_progress" not in seen["ollama"]
