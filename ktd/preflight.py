"""Preflight: can this model start at all? Asked before anything is evicted.

A load that evicts a ready 600 GB model and then dies of a typo costs the
operator a 5-10 minute reload. So every cheap, certain check runs first:
the paths exist and are readable, the model's ``config.json`` parses, the
installed SGLang accepts every flag, a fixed port is free. The checks are a
pure function of gathered :class:`Facts`; :func:`gather` is the thin I/O.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ktd import proctree
from ktd.config import ModelSpec
from ktd.placement import user_flags

__all__ = [
    "Capabilities",
    "Facts",
    "PathFacts",
    "Refused",
    "capabilities_of",
    "check_flags",
    "gather",
    "problems",
    "read_model_config",
]


class Refused(Exception):
    """The load cannot start (preflight or memory fit); nothing was stopped for it."""


class Capabilities(Protocol):
    """What the SGLang capability probe knows; only ``options`` is needed here.

    ``options``: every option string of ``sglang.launch_server``'s argparse
    (``--port``, ``--kt-numa-nodes``...). ``package``/``version`` name the
    installed SGLang in messages.
    """

    @property
    def options(self) -> Iterable[str]: ...


@dataclass(frozen=True)
class PathFacts:
    path: str
    exists: bool
    is_dir: bool = False
    readable: bool = False


@dataclass(frozen=True)
class Facts:
    model_path: PathFacts
    kt_weight_path: PathFacts | None
    config_error: str | None  # None: config.json parsed (or model_path is a file)
    port_free: bool | None  # None: no fixed port


# ---------------------------------------------------------------- the hook for the lead


def capabilities_of(probe: Any) -> Capabilities | None:
    """The probe's SGLang capabilities, or None while they are unknown.

    The SGLang capability probe (ktd/probe.py) plugs in here: give the probe
    result a ``capabilities`` attribute with ``options`` (and optionally
    ``package``/``version``), or change this one function.
    """
    caps = getattr(probe, "capabilities", None)
    return caps if caps is not None and getattr(caps, "options", None) is not None else None


def _known(flag: str, options: frozenset[str]) -> bool:
    """argparse accepts an exact option or a unique prefix of a long one."""
    if flag in options:
        return True
    if not flag.startswith("--"):
        return False
    matches = [o for o in options if o.startswith(flag)]
    return len(matches) == 1


def check_flags(spec: ModelSpec, capabilities: Capabilities | None) -> str | None:
    """The flags of ``extra_args`` the installed SGLang would reject, as one sentence.

    None when all are known, or when the capabilities are unknown (no probe
    yet): an unknown is never a refusal.
    """
    if capabilities is None:
        return None
    options = frozenset(capabilities.options)
    if not options:
        return None
    bad = [f for f in user_flags(spec.extra_args) if not _known(f, options)]
    if not bad:
        return None
    pkg = getattr(capabilities, "package", None) or "SGLang"
    version = getattr(capabilities, "version", None)
    which = f"{pkg} {version}" if version else str(pkg)
    return (
        f"the installed {which} does not accept {', '.join(bad)} (from extra_args); "
        "SGLang would exit with `unrecognized arguments`"
    )


# ---------------------------------------------------------------- pure checks


def _path_problem(what: str, facts: PathFacts) -> str | None:
    if not facts.exists:
        return f"{what} {facts.path} does not exist"
    if not facts.readable:
        return f"{what} {facts.path} is not readable by ktd's user"
    return None


def problems(spec: ModelSpec, facts: Facts, capabilities: Capabilities | None) -> list[str]:
    """Everything that would make the launch fail for certain (empty: go on)."""
    out: list[str] = []
    p = _path_problem("model_path", facts.model_path)
    if p:
        out.append(p)
    elif facts.config_error:
        out.append(facts.config_error)
    if facts.kt_weight_path is not None:
        p = _path_problem("kt_weight_path", facts.kt_weight_path)
        if p:
            out.append(p)
    flags = check_flags(spec, capabilities)
    if flags:
        out.append(flags)
    if facts.port_free is False:
        out.append(f"port {spec.host}:{spec.port} (fixed in the config) is already in use")
    return out


def message(found: Sequence[str]) -> str:
    return "preflight: " + "; ".join(found) + " (no engine was stopped)"


# ---------------------------------------------------------------- I/O


def _path_facts(path: str) -> PathFacts:
    p = Path(path)
    try:
        exists = p.exists()
        is_dir = p.is_dir()
    except OSError:
        return PathFacts(path, False)
    mode = os.R_OK | (os.X_OK if is_dir else 0)
    return PathFacts(path, exists, is_dir, exists and os.access(p, mode))


def read_model_config(model_path: str) -> tuple[dict[str, Any] | None, str | None]:
    """``<model_path>/config.json`` as a dict, or (None, why not). A file path has none."""
    p = Path(model_path)
    if not p.is_dir():
        return None, None
    cfg = p / "config.json"
    try:
        data = json.loads(cfg.read_bytes())
    except FileNotFoundError:
        return None, f"model_path {model_path} has no config.json (not a Hugging Face model dir?)"
    except OSError as exc:
        return None, f"cannot read {cfg}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{cfg} is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"{cfg} is not a JSON object"
    return data, None


def gather(spec: ModelSpec) -> Facts:
    """Blocking file-system and socket look-ups (run it in a thread)."""
    model = _path_facts(spec.path)
    config_error = None
    if model.exists and model.readable:
        _, config_error = read_model_config(spec.path)
    weights = _path_facts(spec.kt_weight_path) if spec.kt_weight_path else None
    port_free = proctree.port_free(spec.host, spec.port) if spec.port else None
    return Facts(model, weights, config_error, port_free)


async def run(spec: ModelSpec, probe: Any) -> str | None:
    """The preflight verdict for ``spec``: None to go on, else the refusal reason."""
    import trio

    facts = await trio.to_thread.run_sync(gather, spec)
    found = problems(spec, facts, capabilities_of(probe))
    return message(found) if found else None
