"""Print, as JSON, every command-line option SGLang's real argparse knows.

    <venv python> tests/real/dump_options.py > options.json

Builds the parser the way ``sglang.srt.server_args.prepare_server_args``
does in both upstream sglang and the kt fork (sglang-kt):
``parser = argparse.ArgumentParser(); ServerArgs.add_cli_args(parser)``,
then walks ``parser._actions``.  Works with either package; which one is
installed is told by ``importlib.metadata.packages_distributions()``.
A few upstream choices depend on environment variables read at
add_cli_args time (e.g. SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE): run with the
engine environment (tests/real/engine_env.py) for a stable dump.
"""

import argparse
import importlib.metadata as md
import json
import sys


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        # a set's order changes with PYTHONHASHSEED: sort it for a stable dump
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is argparse.SUPPRESS:
        return "==SUPPRESS=="
    return repr(value)


def _type_name(t):
    if t is None:
        return None
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)


def build_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def describe(action):
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": type(action).__name__,
        "nargs": _jsonable(action.nargs),
        "choices": None if action.choices is None else _jsonable(
            action.choices if isinstance(action.choices, (set, frozenset)) else list(action.choices)),
        "type": _type_name(action.type),
        "default": _jsonable(action.default),
        "required": bool(action.required),
        "help": None if action.help is None else str(action.help),
    }


def main():
    import sglang.srt.server_args as server_args

    parser = build_parser()
    options = [describe(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    dists = md.packages_distributions().get("sglang")
    out = {
        "distributions": dists,
        "versions": {d: md.version(d) for d in dists or []},
        "server_args_file": server_args.__file__.replace(sys.prefix, "<venv>"),
        "python": sys.version.split()[0],
        "count": len(options),
        "kt_options": [s for o in options for s in o["option_strings"]
                       if "kt" in s.lstrip("-").split("-")],
        "options": options,
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
