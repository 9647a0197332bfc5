"""Ollama's JSON shapes as SGLang 0.5.23 writes them (``entrypoints/ollama/serving.py``). Pure.

Shared by the sim (which answers as SGLang does) and the frontend (which answers
``/api/show`` in SGLang's words for a model whose engine is not loaded, rather
than loading hundreds of GB to describe it).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def timestamp(when: float | None = None) -> str:
    """Ollama's ``created_at``/``modified_at``: UTC, milliseconds, ``Z``."""
    at = datetime.now(UTC) if when is None else datetime.fromtimestamp(when, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def show(model: str, context_length: int) -> dict[str, Any]:
    """SGLang's ``/api/show`` answer for ``model`` (the name as the client sent it)."""
    family = model.split("/")[-1]
    for suffix in ("-Instruct", "-Chat", "-Base"):
        if family.endswith(suffix):
            family = family[: -len(suffix)]
            break
    ctx = context_length
    return {
        "license": "",
        "modelfile": f"FROM {model}\nPARAMETER num_ctx {ctx}\n",
        "parameters": f"num_ctx {ctx}",
        "template": "",
        "modified_at": timestamp(),
        "details": {
            "parent_model": "",
            "format": "sglang",
            "family": family,
            "families": [family],
            "parameter_size": "unknown",
            "quantization_level": "",
        },
        "model_info": {
            "general.architecture": family,
            "general.name": model,
            "general.parameter_count": 0,
            f"{family}.context_length": ctx,
            f"{family}.block_count": 0,
            f"{family}.embedding_length": 0,
            f"{family}.attention.head_count": 0,
        },
        "capabilities": ["completion"],
    }
