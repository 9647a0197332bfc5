"""``ktd up``: the daemon and the frontend as two child processes, for a workstation.

``ktd up --demo`` needs no GPU and no SGLang: it writes a throw-away config whose
only model, ``ktd-sim``, is launched exactly like a real kt engine
(``<python> -m sglang.launch_server ...``) but with the simulated engine's
``sglang`` shim first on ``PYTHONPATH``.

Process handling, because orphans are the top complaint about such tools:
the children get their own process group (a terminal's Ctrl-C reaches only
us, so shutdown happens in order: frontend first, then the daemon, which tears
its engines down) and ``PR_SET_PDEATHSIG`` (if ``ktd up`` is SIGKILLed, they get
SIGTERM instead of living on). When either child dies, the other is stopped
and ``ktd up`` exits.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ktd import paths, uprecord

DEMO_ALIAS = "ktd-sim"
_PR_SET_PDEATHSIG = 1


def shim_dir() -> Path:
    """Directory whose ``sglang/launch_server.py`` runs the sim."""
    return Path(__file__).resolve().parent / "sim" / "shim"


def demo_config(root: Path, bind: str) -> Path:
    """Write config.json + models.json for the demo under ``root``; return config.json."""
    from ktd.sim.model import make_model

    root.mkdir(parents=True, exist_ok=True)
    model_path, weights = make_model(root / "models", DEMO_ALIAS)
    models = [
        {
            "path": model_path,
            "backend": "kt",
            "alias": DEMO_ALIAS,
            "kt": {
                "kt_weight_path": weights,
                # What a non-AMX machine passes too: doctor then judges the demo
                # like a real model instead of failing it on this CPU's ISA.
                # --enable-metrics: the dashboard's tokens/s, TTFT and their plots.
                "extra_args": [
                    "--kt-method",
                    "LLAMAFILE",
                    "--kt-num-gpu-experts",
                    "0",
                    "--enable-metrics",
                ],
                "extra_env": {
                    "PYTHONPATH": str(shim_dir()),
                    # Slow enough to see: a short load (with ": loading" comments
                    # on streams) and tokens at a readable pace.
                    "KTD_SIM_LOAD_TIME": "3",
                    "KTD_SIM_TOKEN_RATE": "30",
                },
            },
            "ttl": 600,
        }
    ]
    config = {
        "ktransformers": {},
        "models_file": "models.json",
        "daemon": {
            "runtime_dir": str(root / "run"),
            "state_dir": str(root / "state"),
            "stop_grace": 5,
            "drain_timeout": 5,
            "health_interval": 1,
        },
        "frontend": {"bind": bind},
    }
    (root / "models.json").write_text(json.dumps(models, indent=2) + "\n")
    path = root / "config.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Child:
    def __init__(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=_pdeathsig,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"ktd up: {self.name} ignored SIGTERM for {timeout:g}s; killing",
                    file=sys.stderr,
                )
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _wait(pred: Callable[[], bool], timeout: float, children: list[Child]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if any(not c.alive() for c in children) or _STOP:
            return False
        time.sleep(0.1)
    return False


def _daemon_answers(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    from ktctl import Client, KtctlError

    try:
        with Client(socket_path, timeout=0.5) as client:
            client.ping()
        return True
    except KtctlError:
        return False


def _frontend_answers(bind: str) -> bool:
    import socket as sk

    if bind.startswith("unix:"):
        return Path(bind[5:]).exists()
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    try:
        with sk.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


_STOP: int | None = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _STOP
    _STOP = signum


def port_busy(bind: str) -> bool:
    """Is the frontend's HOST:PORT taken already? Asked before anything starts: once the
    frontend runs, "something answers on the port" would not tell it from a stranger."""
    import socket as sk

    if bind.startswith("unix:"):
        return False
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = sk.AF_INET6 if ":" in host else sk.AF_INET
    try:
        with sk.socket(family, sk.SOCK_STREAM) as s:
            s.setsockopt(sk.SOL_SOCKET, sk.SO_REUSEADDR, 1)
            s.bind((host, int(port)))
    except OSError:
        return True
    except ValueError:
        return False
    return False


def busy_message(bind: str) -> str:
    return (
        f"ktd up: {bind} is already in use (another ktd up, or another server?); "
        "choose a free address with --bind HOST:PORT"
    )


def no_config_message(path: Path) -> str:
    return (
        f"ktd up: no config at {path}.\n"
        "  ktd up --demo        try everything on the simulated engine (no GPU, no SGLang)\n"
        f"  ktd init             write a starter config.json + models.json at {path}\n"
        "  ktd up --config PATH use a config elsewhere"
    )


def ktctl_command() -> str:
    """How to run ``ktctl`` from here: its name when it is on ``PATH``, else the one
    beside the running interpreter (a venv not activated: ``.venv/bin/ktctl``)."""
    if shutil.which("ktctl"):
        return "ktctl"
    beside = Path(sys.executable).parent / "ktctl"
    return str(beside) if beside.exists() else f"{sys.executable} -m ktctl"


def _banner(
    bind: str, socket_path: Path, demo: bool, root: Path | None, *, api_keys: bool = False
) -> str:
    url = f"http://{bind}" if not bind.startswith("unix:") else bind
    model = DEMO_ALIAS if demo else "<alias>"
    # The key itself is not printed (terminals end up in logs and screenshots).
    auth = ' -H "Authorization: Bearer $KTD_API_KEY"' if api_keys else ""
    lines = [
        "",
        f"ktd is up: frontend {url}, daemon socket {socket_path}",
        "",
        "Try it:",
    ]
    if api_keys:
        lines.append("  export KTD_API_KEY=...   # a key of frontend.api_keys or frontend.keys")
    lines += [
        f"  curl -s {url}/v1/models{auth}",
        f"  curl -sN {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\",
        f'    -d \'{{"model": "{model}", "stream": true, '
        '"messages": [{"role": "user", "content": "Hello"}]}\'',
        f"  {ktctl_command()} --socket {socket_path} status",
        f"  {ktctl_command()} --socket {socket_path} logs {model} -f",
        "",
        "Ctrl-C stops the frontend, then the daemon and its engines.",
    ]
    if not bind.startswith("unix:"):  # a browser reaches a TCP bind only (docs/ui.md)
        token = "?token=<key>" if api_keys else ""
        dashboard = f"  {url}/ui{token}   (the dashboard, in a browser)"
        lines.insert(lines.index("Try it:") + 1, dashboard)
    if demo and root is not None:
        lines.append(f"(demo files in {root}; removed on exit)")
    return "\n".join(lines) + "\n"


@dataclass
class Stack:
    """The stack ``ktd up`` runs: its config, where the frontend listens, the demo's
    directory (``scratch``: a temporary one, removed at the end) and whether keys are set."""

    config_path: Path
    bind: str
    root: Path | None = None
    scratch: bool = False
    keys: bool = False

    def clean(self) -> None:
        if self.scratch and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _setup(args: argparse.Namespace, env: dict[str, str]) -> Stack | int:
    """The demo's files, or the operator's config read and checked (an exit code if not);
    ``env`` gets the children's directories."""
    if args.demo:
        if args.dir:
            root, scratch = Path(args.dir).resolve(), False
        else:
            # Short path: the ipc socket path must stay under ~107 bytes.
            root, scratch = Path(tempfile.mkdtemp(prefix="ktd-demo-", dir="/tmp")), True
        bind = args.bind or "127.0.0.1:8000"
        env["KTD_RUNTIME_DIR"] = str(root / "run")
        env["KTD_STATE_DIR"] = str(root / "state")
        env.pop("KTD_SOCKET", None)
        env.pop("KTD_CONFIG", None)
        return Stack(demo_config(root, bind), bind, root, scratch)
    config_path = Path(args.config) if args.config else paths.default_config_path(env)
    from ktd.core.config import ConfigError
    from ktd.core.configload import load_config

    if not config_path.exists():
        print(no_config_message(config_path), file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"ktd up: config error: {exc}", file=sys.stderr)
        return 2
    if config.daemon.runtime_dir and not env.get("KTD_RUNTIME_DIR"):
        env["KTD_RUNTIME_DIR"] = config.daemon.runtime_dir
    keys = bool(config.frontend.api_keys or config.frontend.keys)
    return Stack(config_path, args.bind or config.frontend.bind, keys=keys)


def main(argv: list[str]) -> int:
    global _STOP
    ap = argparse.ArgumentParser(
        prog="ktd up", description="Run the ktd daemon and the frontend together."
    )
    ap.add_argument("--demo", action="store_true", help="use the simulated engine (no GPU)")
    ap.add_argument("--config", help="config.json (ignored with --demo)")
    ap.add_argument("--socket", help="daemon control socket (default: $KTD_SOCKET or runtime dir)")
    ap.add_argument(
        "--bind", help="frontend HOST:PORT (default: frontend.bind, demo 127.0.0.1:8000)"
    )
    ap.add_argument("--dir", help="with --demo: keep the demo's files here instead of a temp dir")
    ap.add_argument("--stop-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    env = dict(os.environ)
    setup = _setup(args, env)
    if isinstance(setup, int):
        return setup
    if args.socket:
        env["KTD_SOCKET"] = args.socket
    # The children run the same ktd as we do, wherever it was imported from.
    ktd_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ktd_root, env.get("PYTHONPATH")) if p)
    if port_busy(setup.bind):
        print(busy_message(setup.bind), file=sys.stderr)
        setup.clean()
        return 1

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    _STOP = None
    children: list[Child] = []
    try:
        return _run(setup, args.demo, env, children)
    finally:
        uprecord.remove(uprecord.record_path(os.environ), os.getpid())
        # Frontend first (no new requests), then the daemon (drains and stops engines).
        for child in reversed(children):
            child.stop(args.stop_timeout)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        setup.clean()
        if _STOP is not None:
            print("ktd up: stopped", file=sys.stderr)


def _run(setup: Stack, demo: bool, env: dict[str, str], children: list[Child]) -> int:
    """Start the daemon, then the frontend once the daemon answers; print the banner;
    watch both until a signal or one of them exits (its status, or 1)."""
    py = [sys.executable, "-m", "ktd"]
    cfg = ["--config", str(setup.config_path)]
    socket_path = paths.control_path(env)
    bind = setup.bind
    children.append(Child("daemon", [*py, "serve", *cfg], env))
    if not _wait(lambda: _daemon_answers(socket_path), 30.0, children):
        if _STOP is None:
            print("ktd up: the daemon did not come up", file=sys.stderr)
            return 1
        return 0
    # ktctl finds this daemon by itself from now on (ktd/uprecord.py): --demo's socket
    # is in its own directory, not where ktctl looks by default.
    record = uprecord.UpRecord(pid=os.getpid(), socket=socket_path, bind=bind)
    uprecord.write(uprecord.record_path(os.environ), record)
    frontend = Child("frontend", [*py, "frontend", *cfg, "--bind", bind], env)
    children.append(frontend)
    if _wait(lambda: _frontend_answers(bind), 30.0, children):
        scratch = setup.root if setup.scratch else None
        print(_banner(bind, socket_path, demo, scratch, api_keys=setup.keys), flush=True)
    while _STOP is None:
        dead = [c for c in children if not c.alive()]
        if dead:
            for c in dead:
                print(
                    f"ktd up: {c.name} exited with status {c.proc.returncode}; stopping",
                    file=sys.stderr,
                )
                if c is frontend and port_busy(bind):
                    print(busy_message(bind), file=sys.stderr)
            return next((c.proc.returncode for c in dead if c.proc.returncode), 1) or 1
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
