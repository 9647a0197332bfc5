"""Run with an SGLang venv's python: parse argv lists with SGLang's own argparse.

Reads a JSON list of argv lists (``sys.argv[1:]`` of ``sglang.launch_server``)
on stdin; prints one JSON list: ``{"ok": true, "args": {dest: value}}`` or
``{"ok": false, "error": "..."}`` per argv. Parsing is exactly what
``prepare_server_args`` does before ``ServerArgs`` post-processing:
``argparse.ArgumentParser()`` + ``ServerArgs.add_cli_args``, the ``--config`` file
merged by SGLang's own ``ConfigArgumentMerger`` when the word ``--config`` is there
(its ``ValueError``: ``{"ok": false, "code": 1}``), then ``parse_args``.
"""

import argparse
import contextlib
import io
import json
import sys

from sglang.srt.server_args import ServerArgs


def merger() -> type:
    try:  # upstream 0.5.23
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:  # the kt fork 0.7.2
        from sglang.srt.server_args_config_parser import ConfigArgumentMerger
    return ConfigArgumentMerger


def parse(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        try:
            argv = merger()(parser).merge_config_with_args(argv)
        except ValueError as exc:
            return {"ok": False, "code": 1, "error": f"ValueError: {exc}"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit as exc:
        return {"ok": False, "code": exc.code, "error": err.getvalue().strip().splitlines()[-1]}
    args = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, list))}
    return {"ok": True, "args": args}


if __name__ == "__main__":
    print(json.dumps([parse(a) for a in json.load(sys.stdin)]))
