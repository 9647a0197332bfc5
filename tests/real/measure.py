"""Launch the real SGLang once and measure it (numbers in README.md).

    python3 tests/real/measure.py --log /tmp/engine.log [--requests 1] [--no-health]

Starts the server in a new session, times /v1/models 200, /health 200 and the
ready log line, records the process tree, optionally serves one streaming
chat completion (stream_options.include_usage) and one over-long prompt, then
sends SIGTERM to the main pid only and times the exit of main and children.
The whole session is SIGKILLed at the end whatever happened.  Prints JSON.
"""

import argparse, json, os, signal, socket, subprocess, sys, time, urllib.error, urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.real import engine_env as ee

ap = argparse.ArgumentParser()
ap.add_argument("--requests", type=int, default=0)
ap.add_argument("--log", required=True)
ap.add_argument("--timeout", type=float, default=600)
ap.add_argument("--python")
ap.add_argument("--no-health", action="store_true")
ap.add_argument("--model")
a = ap.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url, t=5):
    try:
        with urllib.request.urlopen(url, timeout=t) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()[0]
        return st != "Z"
    except FileNotFoundError:
        return False


res = {}
py, model = a.python or ee.venv_python(), a.model or ee.model_dir()
port = free_port()
cmd = [
    py,
    "-m",
    "sglang.launch_server",
    "--model",
    model,
    "--host",
    "127.0.0.1",
    "--port",
    str(port),
    "--served-model-name",
    "tiny",
    *ee.ENGINE_FLAGS,
]
res["cmd"] = cmd
logf = open(a.log, "w")
t0 = time.monotonic()
p = subprocess.Popen(
    cmd,
    env=ee.engine_env(),
    stdout=logf,
    stderr=subprocess.STDOUT,
    stdin=subprocess.DEVNULL,
    start_new_session=True,
)
base = f"http://127.0.0.1:{port}"
try:
    while time.monotonic() - t0 < a.timeout and not all(
        k in res
        for k in (
            ("models_200", "ready_line")
            if a.no_health
            else ("models_200", "health_200", "ready_line")
        )
    ):
        if p.poll() is not None:
            res["died"] = p.returncode
            break
        now = lambda: round(time.monotonic() - t0, 2)
        if "ready_line" not in res and ee.READY_LINE in open(a.log, errors="replace").read():
            res["ready_line"] = now()
        if "models_200" not in res and get(base + "/v1/models") == 200:
            res["models_200"] = now()
        if "models_200" in res and "health_200" not in res and not a.no_health:
            c = get(base + "/health", 30)
            res.setdefault("health_codes", []).append(c)
            if c == 200:
                res["health_200"] = now()
        time.sleep(0.25)
    res["ps"] = subprocess.run(
        ["ps", "-o", "pid,ppid,pgid,sid,rss,comm,args", "-s", str(p.pid)],
        capture_output=True,
        text=True,
    ).stdout
    kids = [int(l.split()[0]) for l in res["ps"].splitlines()[1:] if int(l.split()[0]) != p.pid]
    comms = {
        k: open(f"/proc/{k}/comm").read().strip() for k in kids if os.path.exists(f"/proc/{k}/comm")
    }
    res["children"] = comms
    for i in range(a.requests):
        t = time.monotonic()
        out = subprocess.run(
            [
                "curl",
                "-sN",
                "-w",
                "\nHTTP %{http_code}\n",
                base + "/v1/chat/completions",
                "-H",
                "content-type: application/json",
                "-d",
                json.dumps(
                    {
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 8,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                ),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        res.setdefault("stream", []).append({"secs": round(time.monotonic() - t, 2), "out": out})
        body = json.dumps(
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hello world " * 300}],
                "max_tokens": 8,
                "stream": True,
            }
        )
        res["overlong"] = subprocess.run(
            [
                "curl",
                "-s",
                "-w",
                "\nHTTP %{http_code} %{content_type}\n",
                base + "/v1/chat/completions",
                "-H",
                "content-type: application/json",
                "-d",
                body,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    time.sleep(1)
    tt = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    gone = {}
    while time.monotonic() - tt < 90:
        if "main" not in gone and p.poll() is not None:
            gone["main"] = round(time.monotonic() - tt, 2)
            res["exit_code"] = p.returncode
        for k, c in comms.items():
            if c not in gone and not alive(k):
                gone[c] = round(time.monotonic() - tt, 2)
        if len(gone) == len(comms) + 1:
            break
        time.sleep(0.05)
    res["gone_after_sigterm"] = gone
finally:
    res["group_before_killpg"] = subprocess.run(
        ["ps", "-o", "pid,stat,comm", "-s", str(p.pid)], capture_output=True, text=True
    ).stdout
    try:
        os.killpg(p.pid, signal.SIGKILL)
        res["group_still_existed_at_end"] = True
    except ProcessLookupError:
        res["group_still_existed_at_end"] = False
    p.wait()
    time.sleep(1)
    left = subprocess.run(
        ["ps", "-o", "pid,stat,comm", "-s", str(p.pid)], capture_output=True, text=True
    ).stdout
    res["left_after"] = left
print(json.dumps(res, indent=1))
