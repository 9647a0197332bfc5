"""Where ktd's files live (docs/architecture.md, "Files and paths").

Pure: everything comes from the env mapping.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def _is_root() -> bool:
    return os.geteuid() == 0


def _placed(env: Mapping[str, str], var: str, system: str, in_home: str) -> Path:
    """A path ``$var`` overrides; else the system's place for root, or one under the
    user's home (``~`` when ``$HOME`` is unset) for anyone else."""
    if env.get(var):
        return Path(env[var])
    if _is_root():
        return Path(system)
    return Path(env.get("HOME", "~")).expanduser() / in_home


def default_config_path(env: Mapping[str, str] = os.environ) -> Path:
    return _placed(env, "KTD_CONFIG", "/etc/ktd/config.json", ".config/ktd/config.json")


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
    return _placed(env, "KTD_STATE_DIR", "/var/lib/ktd", ".local/state/ktd")


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
