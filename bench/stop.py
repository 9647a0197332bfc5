"""How long a stop takes when the engine leaves something behind (issue 20's figures).

Four cases, each on a fresh ``ktd serve`` (``daemon.stop_grace`` = ``--grace``,
30 s as by default) with one sim engine that leaves a process behind when its
server exits (``--orphan``: ``escape`` = ``KTD_SIM_ESCAPE``, a grandchild in its
own session that dies of SIGTERM, which every ktd version's sim has; ``term`` /
``ignore`` = ``KTD_SIM_ORPHAN``):

* ``evict``: ``ktctl evict`` of the ready engine;
* ``adopted``: ``kill -9`` of ktd, a new ``ktd serve`` adopts the engine, evict;
* ``sigterm``: SIGTERM to ktd until it has exited;
* ``wrapper``: the engine's ``python`` is a shell script that does not ``exec``; a
  stream (``--tokens`` at ``--rate`` tokens/s, through ``ktd frontend``) runs while
  ``evict --timeout 0.5`` ends its drain bound: the evict's time, whether the
  stream got every token and ``[DONE]``, and whether ktd sent SIGKILL. No orphan.

Each figure is the wall time of the call; the engine's log says what ktd sent.
Run it from the checkout whose ktd is to be measured (``REPO`` is this file's
parent's parent)::

    python bench/stop.py [--cases evict,adopted,sigterm,wrapper] [--grace 30] [--orphan escape]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, sim_model, time_limit, wait_for

ALIAS = "st"
ORPHAN_ENV = {
    "escape": {"KTD_SIM_ESCAPE": "1"},
    "term": {"KTD_SIM_ORPHAN": "term"},
    "ignore": {"KTD_SIM_ORPHAN": "ignore"},
}


def notes(stack: Stack) -> str:
    """What ktd sent, from the engine's log."""
    lines = stack.client().logs(ALIAS, 400)
    keep = ("SIGTERM to", "SIGKILL to", "stopped", "SIGTERM received", "drain ended")
    return " | ".join(ln.split("] ", 1)[-1] for ln in lines if any(k in ln for k in keep))


def restart_daemon(stack: Stack) -> None:
    assert stack.daemon is not None
    stack.daemon.send_signal(signal.SIGKILL)
    stack.daemon.wait()
    time.sleep(0.3)
    stack.daemon = stack._spawn(
        [sys.executable, "-m", "ktd", "serve", "--config", str(stack.root / "config.json")]
    )
    wait_for(lambda: stack.client(timeout=0.5).ping(), 30, "the new daemon")
    wait_for(lambda: stack.engine(ALIAS).state == "ready", 30, "the adopted engine")


def case_evict(args: argparse.Namespace, *, adopted: bool) -> str:
    model = sim_model(ALIAS, **ORPHAN_ENV[args.orphan])
    with Stack([model], frontend=False, daemon={"stop_grace": args.grace}) as stack:
        stack.load(ALIAS)
        if adopted:
            restart_daemon(stack)
        t0 = time.monotonic()
        stack.client(timeout=args.grace + 60).evict(ALIAS)
        took = time.monotonic() - t0
        return f"{took:6.2f}s  {notes(stack)}"


def case_sigterm(args: argparse.Namespace) -> str:
    model = sim_model(ALIAS, **ORPHAN_ENV[args.orphan])
    stack = Stack([model], frontend=False, daemon={"stop_grace": args.grace})
    try:
        stack.load(ALIAS)
        assert stack.daemon is not None
        t0 = time.monotonic()
        stack.daemon.send_signal(signal.SIGTERM)
        stack.daemon.wait(args.grace + 60)
        took = time.monotonic() - t0
        return f"{took:6.2f}s  exit {stack.daemon.returncode}"
    finally:
        stack.close()


def read_stream(url: str, tokens: int, out: dict[str, Any], started: threading.Event) -> None:
    import httpx

    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}
    body |= {"max_tokens": tokens, "stream": True}
    out.update(tokens=0, done=False)
    try:
        with (
            httpx.Client(base_url=url, timeout=300) as c,
            c.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if event.get("choices") and event["choices"][0]["delta"].get("content"):
                        out["tokens"] += 1
                        started.set()
    except Exception as exc:
        out["error"] = repr(exc)
    finally:
        started.set()


def case_wrapper(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = Path(tmp) / "py-wrapper"
        wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
        model = sim_model(
            ALIAS, KTD_SIM_TOKEN_RATE=args.rate, KTD_SIM_DRAIN=600, KTD_SIM_SGLANG="upstream"
        )
        model["kt"]["python"] = str(wrapper)
        daemon = {"stop_grace": args.grace, "drain_timeout": 60}
        with Stack([model], daemon=daemon) as stack:
            stack.load(ALIAS)
            out: dict[str, Any] = {}
            started = threading.Event()
            reader = threading.Thread(
                target=read_stream, args=(stack.url, args.tokens, out, started), daemon=True
            )
            reader.start()
            started.wait(60)
            t0 = time.monotonic()
            stack.client(timeout=args.grace + 60).evict(ALIAS, timeout=0.5)
            took = time.monotonic() - t0
            reader.join(args.grace + 60)
            got = f"stream {out.get('tokens')}/{args.tokens} tokens, [DONE] {out.get('done')}"
            if "error" in out:
                got += f", error {out['error']}"
            return f"{took:6.2f}s  {got}  {notes(stack)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="evict,adopted,sigterm,wrapper")
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--orphan", choices=sorted(ORPHAN_ENV), default="escape")
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--limit", type=float, default=900.0, help="seconds for the whole run")
    args = p.parse_args()
    cases = {
        "evict": lambda: case_evict(args, adopted=False),
        "adopted": lambda: case_evict(args, adopted=True),
        "sigterm": lambda: case_sigterm(args),
        "wrapper": lambda: case_wrapper(args),
    }
    print(f"grace {args.grace:g}s, orphan {args.orphan}, {Path(__file__).resolve().parents[1]}")
    with time_limit(args.limit):
        for name in args.cases.split(","):
            print(f"{name:8} {cases[name]()}", flush=True)


if __name__ == "__main__":
    main()
