"""The sim's command line: ``sglang.launch_server``'s flags, kt fork included.

Why: ktd hands the sim exactly the argv it would hand real SGLang, so every
flag must be accepted. The flags whose values the sim reflects (bind address,
model path, served name, context length, kt weights ...) are declared with
SGLang's names and defaults, and ``--help`` lists the ``--kt-*`` flags as the
kt fork's does (``ktctl doctor`` greps for them). Any other flag is accepted,
ignored and logged, like a newer SGLang flag would be by an older ktd test.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
    ignored: list[str] = field(default_factory=list)  # flags accepted but not understood


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description="ktd's simulated SGLang (kt fork) server: same flags, same endpoints.",
        allow_abbrev=False,  # an unknown --kt-foo must never match a declared flag's prefix
    )
    add = p.add_argument
    add("--model-path", "--model", dest="model_path", type=str, required=True)
    add("--tokenizer-path", type=str, default=None)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--served-model-name", type=str, default=None)
    add("--context-length", type=int, default=None)
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", type=str, default=None)
    add("--mem-fraction-static", type=float, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--chunked-prefill-size", type=int, default=None)
    add("--attention-backend", type=str, default=None)
    add("--chat-template", type=str, default=None)
    add("--trust-remote-code", action="store_true")
    add("--disable-cuda-graph", action="store_true")
    add("--cuda-graph-max-bs", type=int, default=None)
    add("--enable-mixed-chunk", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--is-embedding", action="store_true")
    add("--watchdog-timeout", type=float, default=300)
    add("--random-seed", type=int, default=None)
    add("--api-key", type=str, default=None)
    add("--log-level", type=str, default="info")
    add("--log-level-http", type=str, default=None)
    kt = p.add_argument_group("kt-kernel (kvcache-ai/sglang fork)")
    kt.add_argument("--kt-weight-path", type=str, default=None)
    kt.add_argument("--kt-method", type=str, default="AMXINT4")
    kt.add_argument("--kt-cpuinfer", type=int, default=None)
    kt.add_argument("--kt-threadpool-count", type=int, default=2)
    kt.add_argument("--kt-numa-nodes", type=str, nargs="+", default=None)
    kt.add_argument("--kt-num-gpu-experts", type=int, default=None)
    kt.add_argument("--kt-gpu-experts-ratio", type=float, default=None)
    kt.add_argument("--kt-max-deferred-experts-per-token", type=int, default=None)
    kt.add_argument("--kt-gpu-prefill-token-threshold", type=int, default=None)
    kt.add_argument("--kt-enable-dynamic-expert-update", action="store_true")
    kt.add_argument("--kt-expert-placement-strategy", type=str, default=None)
    return p


def parse(argv: Sequence[str] | None = None) -> SimArgs:
    """Parse like SGLang; exits 2 with argparse's message on a malformed known flag."""
    ns, unknown = build_parser().parse_known_args(argv)
    args: dict[str, Any] = vars(ns)
    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["context_length"] is None:
        args["context_length"] = DEFAULT_CONTEXT_LENGTH
    level_http = (args["log_level_http"] or args["log_level"] or "info").lower()
    return SimArgs(
        host=args["host"],
        port=args["port"],
        model_path=args["model_path"],
        tokenizer_path=args["tokenizer_path"],
        served_model_name=args["served_model_name"],
        context_length=args["context_length"],
        kt_weight_path=args["kt_weight_path"],
        tp_size=args["tp_size"],
        api_key=args["api_key"],
        # uvicorn prints access lines at INFO; --log-level-http warning silences them.
        access_log=level_http in ("debug", "info", "trace"),
        is_embedding=args["is_embedding"],
        server_args=args,
        ignored=list(unknown),
    )


def server_args_repr(args: SimArgs) -> str:
    """``ServerArgs(model_path='...', ...)``: the line SGLang logs first."""
    inner = ", ".join(f"{k}={v!r}" for k, v in args.server_args.items())
    return f"ServerArgs({inner})"
