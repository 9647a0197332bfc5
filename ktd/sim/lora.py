"""LoRA adapters from SGLang's ``--enable-lora`` / ``--lora-paths`` flags.

Why parsed here from the flags the sim's argv parser left over: ktd passes
LoRA flags through ``extra_args`` untouched, and the sim must then answer as
SGLang does: adapters listed in ``/v1/models`` (``id`` = adapter name,
``parent`` = the served name) and ``model: "<served>:<adapter>"`` accepted.
``--lora-paths`` takes ``name=path``, a bare ``path`` (named after itself), or
SGLang's JSON ``{"lora_name": ..., "lora_path": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def lora_enabled(extra: Sequence[str]) -> bool:
    return "--enable-lora" in extra or bool(adapters(extra))


def adapters(extra: Sequence[str]) -> dict[str, str]:
    """``{name: path}`` from ``--lora-paths`` values in ``extra`` (leftover argv)."""
    out: dict[str, str] = {}
    values: list[str] = []
    i = 0
    while i < len(extra):
        tok = extra[i]
        i += 1
        if tok.startswith("--lora-paths="):
            values.append(tok.split("=", 1)[1])
        elif tok == "--lora-paths":
            while i < len(extra) and not extra[i].startswith("--"):
                values.append(extra[i])
                i += 1
    for value in values:
        if value.startswith("{"):
            try:
                obj = json.loads(value)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("lora_name"), str):
                out[obj["lora_name"]] = str(obj.get("lora_path", obj["lora_name"]))
            continue
        name, sep, path = value.partition("=")
        out[name if sep else value] = path if sep else value
    return out
