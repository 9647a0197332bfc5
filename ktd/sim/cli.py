"""The sim's command line: exactly ``sglang.launch_server``'s (see :mod:`ktd.sim.flags`).

Why strict: ktd hands the sim exactly the argv it would hand real SGLang, and
real SGLang refuses what it does not know (exit 2, ``unrecognized
arguments``), so the stand-in must too, or ktd's tests prove nothing about
the command line. The fields the sim reflects (bind address, model path,
served name, context length, kt weights ...) are read from the namespace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ktd.sim import configfile, flags

DEFAULT_CONTEXT_LENGTH = 4096


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
    context = args.get("context_length") or DEFAULT_CONTEXT_LENGTH
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


def server_args_repr(args: SimArgs) -> str:
    """``ServerArgs(model_path='...', ...)``: the line SGLang logs first."""
    inner = ", ".join(f"{k}={v!r}" for k, v in args.server_args.items())
    return f"ServerArgs({inner})"
