"""The sim's command line: exactly ``sglang.launch_server``'s (see :mod:`ktd.sim.flags`).

Why strict: ktd hands the sim exactly the argv it would hand real SGLang, and
real SGLang refuses what it does not know (exit 2, ``unrecognized
arguments``), so the stand-in must too, or ktd's tests prove nothing about
the command line. The fields the sim reflects (bind address, model path,
served name, context length, kt weights ...) are read from the namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ktd.sim import configfile, flags

#: Without a readable config.json (the sim's own tests point at paths that hold none)
#: the sim assumes this; SGLang itself would not start.
DEFAULT_CONTEXT_LENGTH = 4096
#: SGLang's ``CONTEXT_LENGTH_KEYS``, in its order: the first the model's config has wins.
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class SimArgs:
    """The parsed command line: typed fields the sim uses plus every parsed flag."""

    host: str
    port: int
    model_path: str
    tokenizer_path: str
    served_model_name: str
    context_length: int
    kt_weight_path: str | None
    tp_size: int
    api_key: str | None
    access_log: bool
    is_embedding: bool
    server_args: dict[str, Any] = field(default_factory=dict)  # what /server_info shows


def build_parser(which: str | None = None) -> argparse.ArgumentParser:
    """SGLang's own parser: ``argparse.ArgumentParser()`` + every option it declares."""
    which = which or flags.flavor()
    prog = "sglang serve" if which == "upstream" else "launch_server.py"
    p = argparse.ArgumentParser(prog=prog)
    flags.add_cli_args(p, which)
    return p


def parse(argv: Sequence[str] | None = None, which: str | None = None) -> SimArgs:
    """Parse exactly as SGLang does: an unknown flag or a bad value exits 2; a
    ``--config`` file is merged first (``ktd.sim.configfile``; a bad one exits 1)."""
    which = which or flags.flavor()
    parser = build_parser(which)
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        words = configfile.merge(words, which)
    except (configfile.ConfigFileError, OSError, yaml.YAMLError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    ns = parser.parse_args(words)
    args: dict[str, Any] = vars(ns)
    model = args["model_path"]
    tokenizer = args.get("tokenizer_path") or model
    served = args.get("served_model_name") or model
    context = context_length(model, args.get("context_length"))
    level_http = (args.get("log_level_http") or args.get("log_level") or "info").lower()
    return SimArgs(
        host=args.get("host") or "127.0.0.1",
        port=int(args.get("port") or 30000),
        model_path=model,
        tokenizer_path=tokenizer,
        served_model_name=served,
        context_length=int(context),
        kt_weight_path=args.get("kt_weight_path"),
        tp_size=int(args.get("tp_size") or args.get("tensor_parallel_size") or 1),
        api_key=args.get("api_key"),
        # uvicorn prints access lines at INFO; --log-level-http warning silences them.
        access_log=level_http in ("debug", "info", "trace"),
        is_embedding=bool(args.get("is_embedding")),
        server_args=args,
    )


def derived_context_length(model_path: str) -> int | None:
    """SGLang's ``get_context_length`` of the model's config (its text config for a
    multimodal one): the first of ``CONTEXT_LENGTH_KEYS``, times ``rope_scaling``'s
    factor unless the scaling names its original length or is llama3's; 2048 without
    any; None without a readable config.json."""
    try:
        with open(Path(model_path) / "config.json", "rb") as f:
            config = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for sub in ("text_config", "llm_config", "language_config", "thinker_config"):
        if isinstance(config.get(sub), dict):
            config = config[sub]
            break
    scaling = config.get("rope_scaling")
    factor: float = 1
    if isinstance(scaling, dict) and scaling:
        factor = scaling.get("factor", 1) or 1
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if value is not None:
            return int(factor * value)
    return 2048


def context_length(model_path: str, given: int | None) -> int:
    """The context length as SGLang's ``ModelConfig`` settles it: the model's own unless
    ``--context-length`` says otherwise; one longer than the model's is refused (the
    server does not start) unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``."""
    derived = derived_context_length(model_path)
    if given is None:
        return derived if derived is not None else DEFAULT_CONTEXT_LENGTH
    if derived is not None and given > derived:
        allowed = os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower()
        if allowed not in ("1", "true", "yes"):
            print(
                f"ValueError: Warning: User-specified context_length ({given}) is greater than "
                f"the derived context_length ({derived}). This may lead to incorrect model "
                "outputs or CUDA errors. Note that the derived context_length may differ from "
                "max_position_embeddings in the model's config. To allow overriding this "
                "maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
                file=sys.stderr,
            )
            raise SystemExit(1)
    return int(given)


def server_args_repr(args: SimArgs) -> str:
    """``ServerArgs(model_path='...', ...)``: the line SGLang logs first."""
    inner = ", ".join(f"{k}={v!r}" for k, v in args.server_args.items())
    return f"ServerArgs({inner})"
