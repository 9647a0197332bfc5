"""A stand-in model on disk for the sim: a real ``config.json`` and a small kt weight file.

The sim ignores weights, but ktd's preflight and memory estimate read the
model's files like they would a real model's; pointing the demo and the tests
at paths that do not exist would make every load fail preflight (and doctor
report a dozen false failures). Stdlib only.
"""

from __future__ import annotations

import json
from pathlib import Path

#: A tiny Qwen2-MoE-shaped config: what the memory estimate reads.
SIM_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    # The context SGLang derives from it (and ktd's estimate reads): a real MoE's order.
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def make_model(root: Path, alias: str) -> tuple[str, str]:
    """Create ``root/alias`` (config.json) and ``root/alias-kt`` (one weight file).

    Idempotent; returns (model_path, kt_weight_path).
    """
    model = root / alias
    weights = root / f"{alias}-kt"
    model.mkdir(parents=True, exist_ok=True)
    weights.mkdir(parents=True, exist_ok=True)
    cfg = model / "config.json"
    if not cfg.exists():
        cfg.write_text(json.dumps({**SIM_CONFIG, "_name_or_path": alias}, indent=2) + "\n")
    blob = weights / "experts.bin"
    if not blob.exists():
        blob.write_bytes(b"\0" * 4096)
    return str(model), str(weights)
