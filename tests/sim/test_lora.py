"""The sim's LoRA flags (``ktd.sim.lora``), as SGLang reads them."""

from __future__ import annotations

from ktd.sim.cli import parse
from ktd.sim.lora import adapters, lora_enabled


def test_sim_lora_flags() -> None:
    argv = ["--model", "/m", "--enable-lora", "--lora-paths", "a=/l/a", "/l/b",
            '{"lora_name": "c", "lora_path": "/l/c"}']  # fmt: skip
    parsed = parse(argv, "kt").server_args
    assert adapters(parsed) == {"a": "/l/a", "/l/b": "/l/b", "c": "/l/c"}
    assert adapters(parse(["--model", "/m", "--lora-paths=x=/y"]).server_args) == {"x": "/y"}
    assert lora_enabled(parse(["--model", "/m", "--enable-lora"]).server_args)
    assert not lora_enabled(parse(["--model", "/m"]).server_args)
