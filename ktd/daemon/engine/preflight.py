"""Preflight: can this model start at all? Asked before anything is evicted.

A load that evicts a ready 600 GB model and then dies of a typo costs the
operator a 5-10 minute reload. So every cheap, certain check runs first:
the paths exist and are readable (and, for a directory ktd pulled, its pull finished
and every checksum matched: ``ktd.catalog.verify``), the model's ``config.json`` parses, the
installed SGLang accepts every flag (its option catalogue, from the probe), a
fixed port is free. The checks are a
pure function of gathered :class:`Facts`; :func:`gather` is the thin I/O.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ktd import foreign
from ktd.catalog.verify import pull_problems
from ktd.core.command import LaunchError, build_launch
from ktd.core.config import ModelSpec
from ktd.core.sglang_options import SGLangOptions
from ktd.daemon.engine import proctree

__all__ = [
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
    # a path ktd pulled that is unfinished, or whose checksums did not match (issue 44)
    pulls: tuple[str, ...] = ()


# ---------------------------------------------------------------- flags vs the installed SGLang


def capabilities_of(probe: Any) -> SGLangOptions | None:
    """The installed SGLang's option catalogue from the probe, or None while unknown."""
    catalog = getattr(probe, "catalog", None)
    return catalog if isinstance(catalog, SGLangOptions) else None


def check_flags(spec: ModelSpec, capabilities: SGLangOptions | None) -> str | None:
    """Why the installed SGLang would refuse this model's command line (unknown,
    ambiguous or value-less flags in ``extra_args``), or None.

    The same rules the launch applies (``ktd.core.command.build_launch`` with the
    probe's catalogue, argparse's prefix rule included); no catalogue = unknown,
    which is never a refusal.
    """
    if capabilities is None:
        return None
    try:
        build_launch(spec, spec.port or 1, (), capabilities)
    except LaunchError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------- pure checks


def _path_problem(what: str, facts: PathFacts) -> str | None:
    if not facts.exists:
        return f"{what} {facts.path} does not exist"
    if not facts.readable:
        return f"{what} {facts.path} is not readable by ktd's user"
    return None


def problems(spec: ModelSpec, facts: Facts, capabilities: SGLangOptions | None) -> list[str]:
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
    out.extend(facts.pulls)
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
        data = foreign.loads(cfg.read_bytes())
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
    pulls = [
        problem
        for path, facts in ((spec.path, model), (spec.kt_weight_path, weights))
        if path and facts is not None and facts.is_dir and facts.readable
        for problem in pull_problems(path)
    ]
    return Facts(model, weights, config_error, port_free, tuple(pulls))


async def run(spec: ModelSpec, probe: Any) -> str | None:
    """The preflight verdict for ``spec``: None to go on, else the refusal reason."""
    import trio

    facts = await trio.to_thread.run_sync(gather, spec)
    found = problems(spec, facts, capabilities_of(probe))
    return message(found) if found else None
