"""Where ktd's files live (docs/architecture.md, "Files and paths").

Pure: everything comes from the env mapping.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def _is_root() -> bool:
    return os.geteuid() == 0


def default_config_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("KTD_CONFIG"):
        return Path(env["KTD_CONFIG"])
    if _is_root():
        return Path("/etc/ktd/config.json")
    return Path(env.get("HOME", "~")).expanduser() / ".config/ktd/config.json"


def runtime_dir(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("KTD_RUNTIME_DIR"):
        return Path(env["KTD_RUNTIME_DIR"])
    if _is_root():
        return Path("/run/ktd")
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "ktd"
    return Path(f"/tmp/ktd-{os.getuid()}")


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("KTD_STATE_DIR"):
        return Path(env["KTD_STATE_DIR"])
    if _is_root():
        return Path("/var/lib/ktd")
    return Path(env.get("HOME", "~")).expanduser() / ".local/state/ktd"


def control_path(env: Mapping[str, str] = os.environ) -> Path:
    """The control socket: ``$KTD_SOCKET`` wins over the runtime dir."""
    sock = env.get("KTD_SOCKET")
    if sock:
        return Path(sock.removeprefix("ipc://"))
    return runtime_dir(env) / "control.sock"


def events_path(control: Path) -> Path:
    """The PUB socket sits beside the control socket, whatever overrode its path."""
    return control.with_name("events.sock")


def endpoint(path: Path) -> str:
    return f"ipc://{path}"
