"""The Node.js client (``clients/node``, on the npm registry's ``zeromq`` and
``@msgpack/msgpack``) against a real ``ktd serve`` on sim engines: the same answers as
ktctl, and clear errors for a bad alias, a refused load, a daemon that is not running,
and a newer daemon's replies (unknown fields, states and protocol minor).

The packages are installed once into ``$KTD_NODE_CACHE`` (default ``~/.cache/ktd-node``),
as the frontend's Node client tests do: ``zeromq`` 6.8.0 ships its native addon
inside the package (``--ignore-scripts``: nothing is built or downloaded at install).
One daemon serves the whole module; each test leaves every engine stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ktd import protocol as p
from ktd import protocol_schema
from tests.conftest import (
    MARK,
    REPO,
    ConfigWriter,
    DaemonProc,
    own_env,
    sim_model,
    wait_for,
)
from tests.ktctl.ktctl_fakes import FakeDaemon

PACKAGES = ("zeromq@6.8.0", "@msgpack/msgpack@3.1.3")
CLI = REPO / "clients" / "node" / "cli.js"


@pytest.fixture(scope="session")
def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed (apt-get install -y nodejs npm)"
    root = Path(os.environ.get("KTD_NODE_CACHE", Path.home() / ".cache" / "ktd-node"))
    prefix = root / "-".join(p.replace("@", "").replace("/", "-") for p in PACKAGES)
    if not (prefix / "node_modules" / "zeromq" / "package.json").exists():
        prefix.mkdir(parents=True, exist_ok=True)
        flags = ("--no-audit", "--no-fund", "--ignore-scripts")
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), *flags, *PACKAGES],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return prefix / "node_modules"


@dataclass
class Node:
    modules: Path
    socket: Path

    def run(self, *args: str, socket: Path | None = None, timeout: float = 120) -> Ran:
        started = time.monotonic()
        done = subprocess.run(
            ["node", str(CLI), "--socket", str(socket or self.socket), *args],
            env={**os.environ, "NODE_PATH": str(self.modules)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


@dataclass
class Ran:
    code: int
    out: str
    err: str
    took: float

    def doc(self) -> Any:
        return json.loads(self.out)


@pytest.fixture(scope="module")
def daemon(shared_marker: str) -> Iterator[DaemonProc]:
    root = Path(tempfile.mkdtemp(prefix="ktd-node-", dir="/tmp"))
    bad = sim_model("bad")
    bad["path"] = str(root / "no-such-model")
    cfg = ConfigWriter(root / "etc")(
        [
            sim_model("n1"),
            sim_model("n2", numa=[0], sleep=True),
            bad,
        ]
    )
    env = own_env()
    env[MARK] = shared_marker
    env["KTD_RUNTIME_DIR"] = str(root / "run")
    env["KTD_STATE_DIR"] = str(root / "state")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    d = DaemonProc(config=cfg, env=env, log_path=root / "ktd.log").start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node(node_modules: Path, daemon: DaemonProc) -> Iterator[Node]:
    yield Node(node_modules, daemon.socket)
    with daemon.client(timeout=60) as c:  # what a test loaded goes, for the next one
        c.evict(all=True, force=True)


def ktctl(d: DaemonProc, *args: str) -> Any:
    ran = d.ktctl("--json", *args)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


# The fields of an engine both clients must agree on (``since`` and counters move).
SAME = ("alias", "state", "pid", "port", "url", "argv", "numa_nodes", "gpus", "cpus", "sleep")


def same_engines(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert [{k: e.get(k) for k in SAME} for e in a] == [{k: e.get(k) for k in SAME} for e in b]


def test_ping_and_schema_as_ktctl_sees_them(node: Node, daemon: DaemonProc) -> None:
    got = node.run("ping")
    assert got.code == 0, got.err
    pong, theirs = got.doc(), ktctl(daemon, "ping")
    assert daemon.proc is not None
    assert pong == {k: v for k, v in theirs.items() if k != "socket"}
    assert pong["pid"] == daemon.proc.pid
    assert pong["protocol"] == theirs["protocol"] == msgspec.to_builtins(p.PROTOCOL)
    assert pong["features"] == theirs["features"] == list(p.FEATURES)
    schema = node.run("schema")
    assert schema.code == 0, schema.err
    committed = protocol_schema.DOCS / f"ktd-control-{p.PROTOCOL}.json"
    assert schema.doc() == json.loads(committed.read_text())


def test_status_resolves_to_an_array_as_the_readme_says(node: Node) -> None:
    """Issue 43: the README said ``status()`` gives what ``ktctl status --json`` prints
    (``{"engines": [...]}``); it resolves to the array itself."""
    script = (
        f"const {{ Client }} = require({json.dumps(str(CLI.parent / 'index.js'))});"
        "(async () => { const c = new Client({ socket: process.argv[1] });"
        " const e = await c.status();"
        " console.log(JSON.stringify({ array: Array.isArray(e), aliases: e.map((x) => x.alias) }));"
        " c.close(); })();"
    )
    done = subprocess.run(
        ["node", "-e", script, str(node.socket)],
        env={**os.environ, "NODE_PATH": str(node.modules)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"array": True, "aliases": ["n1", "n2", "bad"]}
    readme = (CLI.parent / "README.md").read_text()
    [line] = [ln for ln in readme.splitlines() if "await ktd.status()" in ln]
    assert "an array" in line and "ktctl status --json" not in line


def test_load_with_progress_status_wait_and_evict(node: Node, daemon: DaemonProc) -> None:
    loaded = node.run("load", "n1")
    assert loaded.code == 0, loaded.err
    engine = loaded.doc()["engine"]
    assert engine["state"] == "ready" and engine["url"] and engine["pid"]
    # Its progress: the engine.n1 events of this load, subscribed before it was sent.
    assert loaded.doc()["states"][-1] == "ready" and "starting" in loaded.doc()["states"]
    mine, theirs = node.run("status").doc(), ktctl(daemon, "status")
    same_engines(mine["engines"], theirs["engines"])
    assert node.run("status", "n1").doc()["engines"][0]["pid"] == engine["pid"]
    waited = node.run("wait", "n1", "--state", "ready", "--timeout", "10")
    assert waited.code == 0 and waited.doc()["engine"]["pid"] == engine["pid"]
    evicted = node.run("evict", "n1")
    assert evicted.code == 0 and evicted.doc() == {"evicted": ["n1"]}
    assert ktctl(daemon, "status", "n1")["engines"][0]["state"] == "stopped"
    late = node.run("wait", "n1", "--timeout", "0.3")
    assert late.code == 5 and late.doc()["error"]["code"] == "timeout"


def test_sleep_and_wake(node: Node, daemon: DaemonProc) -> None:
    assert node.run("load", "n2").code == 0
    slept = node.run("sleep", "n2")
    assert slept.code == 0, slept.err
    assert slept.doc()["engine"]["state"] == "asleep"
    assert ktctl(daemon, "status", "n2")["engines"][0]["state"] == "asleep"
    woke = node.run("wake", "n2")
    assert woke.code == 0 and woke.doc()["engine"]["state"] == "ready"
    assert woke.doc()["engine"]["pid"] == slept.doc()["engine"]["pid"]  # woken, not reloaded
    nope = node.run("sleep", "n1")  # not configured to sleep: ktd's own error, as ktctl's
    assert nope.code == 1 and nope.doc()["error"]["code"] == "no_sleep"
    theirs = daemon.ktctl("sleep", "n1")
    assert theirs.returncode == 1 and nope.err.split(": ", 2)[2] in theirs.stderr


def test_usage_as_ktctl_sees_it(node: Node, daemon: DaemonProc) -> None:
    # What a frontend reports (its claim report carries the counts): one batch.
    row = p.UsageCount(day="2026-01-30", key="alice", model="n1", requests=3, prompt=10)
    with daemon.client() as c:
        c.request(p.Sync(client="node-test", usage=[row], usage_seq=1))
    mine = node.run("usage", "--since", "2026-01-01")
    assert mine.code == 0, mine.err
    assert mine.doc() == ktctl(daemon, "usage", "--since", "2026-01-01")
    assert mine.doc()["usage"] == [msgspec.to_builtins(row)]
    assert node.run("usage", "--key", "bob").doc() == {"usage": []}


def test_following_events(node: Node, daemon: DaemonProc) -> None:
    follower = subprocess.Popen(
        ["node", str(CLI), "--socket", str(daemon.socket), "events", "engine.n1", "--count", "2"],
        env={**os.environ, "NODE_PATH": str(node.modules)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stderr is not None
        assert follower.stderr.readline() == "ktd-node: subscribed\n"
        with daemon.client(timeout=60) as c:
            c.load("n1")
        out, _ = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["topic"] for e in events] == ["engine.n1", "engine.n1"]
    assert events[0]["state"] == "starting" and events[0]["alias"] == "n1"


def test_clear_errors_as_ktctl_s(node: Node, daemon: DaemonProc, tmp_path: Path) -> None:
    unknown = node.run("load", "no-such-alias")
    theirs = daemon.ktctl("--json", "load", "no-such-alias")
    assert unknown.code == theirs.returncode == 4
    assert unknown.doc()["error"]["code"] == json.loads(theirs.stdout)["error"]["code"]
    assert unknown.doc()["error"]["code"] == "unknown_model"
    refused = node.run("load", "bad")
    theirs = daemon.ktctl("--json", "load", "bad")
    assert refused.code == theirs.returncode == 1
    error = refused.doc()["error"]
    assert error["code"] == json.loads(theirs.stdout)["error"]["code"] == "load_failed"
    assert "no-such-model" in error["message"] and "does not exist" in error["message"]
    # No daemon: at once, the same words as ktctl's.
    missing = tmp_path / "control.sock"
    gone = node.run("status", socket=missing)
    theirs = daemon.ktctl("--socket", str(missing), "status")
    assert gone.code == theirs.returncode == 3 and gone.took < 5
    assert gone.err == theirs.stderr.replace("ktctl:", "ktd-node:")
    stale = tmp_path / "stale.sock"
    import socket as _socket

    with _socket.socket(_socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening: a dead daemon's socket file
    gone = node.run("ping", socket=stale)
    assert gone.code == 3 and "stale socket" in gone.err


NEWER_ENGINE = {
    "alias": "m",
    "state": "hibernating",
    "pid": 9,
    "port": 30000,
    "zz_new_field": {"a": [1, 2]},
}


def newer(req: p.Request, d: FakeDaemon) -> list[bytes]:
    """A daemon of protocol 1.9: fields, states and features this client does not know."""
    reply: dict[str, Any]
    if isinstance(req, p.Ping):
        reply = {
            "type": "pong",
            "version": "9.0",
            "pid": 5,
            "protocol": {"major": 1, "minor": 9, "zz": 1},
            "features": ["sleep", "time_travel"],
        }
    elif isinstance(req, p.Status):
        reply = {"type": "status", "engines": [NEWER_ENGINE], "zz_top": True}
        d.publish(p.Event(topic="engine.m", time=1.0, alias="m", state="thawing"))
        d.publish(p.Event(topic="engine.m", time=2.0, alias="m", state="ready"))
    else:
        reply = {"type": "error", "code": "bad_request", "message": "?"}
    return [msgspec.msgpack.encode({**reply, "id": req.id, "zz_extra": [1]})]


def test_a_newer_daemon_s_replies(node: Node, tmp_path: Path) -> None:
    d = FakeDaemon(tmp_path, newer)
    try:
        pong = node.run("ping", socket=d.path)
        assert pong.code == 0, pong.err
        assert pong.doc()["protocol"]["minor"] == 9 and pong.doc()["version"] == "9.0"
        assert pong.doc()["features"] == ["sleep", "time_travel"]
        status = node.run("status", socket=d.path)
        assert status.code == 0, status.err
        [engine] = status.doc()["engines"]
        assert engine["state"] == "hibernating" and engine["pid"] == 9
        # A state it does not know, on the way to the one it waits for.
        waited = node.run("wait", "m", "--timeout", "10", socket=d.path)
        assert waited.code == 0, waited.err
        # The requests it sent decoded as ktd's own (the fake decodes with ktd.protocol).
        assert [type(r).__name__ for r in d.requests] == ["Ping", "Status", "Status", "Status"]
    finally:
        d.close()


PAIRING = """
const { Client, REPLIES, ProtocolError } = require(process.argv[1]);
(async () => {
  const ktd = new Client({ socket: process.argv[2] });
  const out = { replies: REPLIES };
  try {
    await ktd.request({ op: "catalog", name: "m" });
    out.catalog = "resolved";
  } catch (err) {
    out.catalog = err instanceof ProtocolError ? err.message : String(err);
  }
  out.cancel = (await ktd.request({ op: "pull_cancel", name: "m" })).type;
  ktd.close();
  console.log(JSON.stringify(out));
})();
"""


def test_replies_are_paired_by_the_schema_s_table(node: Node, tmp_path: Path) -> None:
    """The client pairs a request with its reply by ``replies.json``, the schema's
    ``x-ktd-reply-types`` (no pairing of its own): a ``pulls`` answer to ``catalog``
    is a ProtocolError, to ``pull_cancel`` the reply."""
    d = FakeDaemon(tmp_path, lambda req, d: [p.PullsReply(id=req.id)])
    try:
        done = subprocess.run(
            ["node", "-e", PAIRING, str(CLI.parent / "index.js"), str(d.path)],
            env={**os.environ, "NODE_PATH": str(node.modules)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        d.close()
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["replies"] == protocol_schema.current()["x-ktd-reply-types"]
    assert got["catalog"] == "ktd answered pulls to catalog, where catalog was expected"
    assert got["cancel"] == "pulls"


def test_the_daemon_served_every_client_throughout(daemon: DaemonProc) -> None:
    """Nothing the node client sent made the daemon log a traceback."""
    wait_for(lambda: daemon.proc is not None and daemon.proc.poll() is None, 1, "daemon alive")
    assert "Traceback" not in daemon.output()
