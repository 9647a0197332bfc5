"""LoRA adapters from SGLang's ``--enable-lora`` / ``--lora-paths`` flags.

Why: ktd passes LoRA flags through ``extra_args`` untouched, and the sim must
then answer as SGLang does: adapters listed in ``/v1/models`` (``id`` = adapter name,
``parent`` = the served name) and ``model: "<served>:<adapter>"`` accepted.
``--lora-paths`` takes ``name=path``, a bare ``path`` (named after itself), or
SGLang's JSON ``{"lora_name": ..., "lora_path": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def lora_enabled(server_args: dict[str, Any]) -> bool:
    return bool(server_args.get("enable_lora")) or bool(adapters(server_args))


def adapters(server_args: dict[str, Any]) -> dict[str, str]:
    """``{name: path}`` from the parsed ``--lora-paths`` values."""
    out: dict[str, str] = {}
    values: Sequence[str] = server_args.get("lora_paths") or ()
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
