"""Preflight checks (pure) and the SGLang flag hook."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ktd import preflight
from ktd.config import ModelSpec


@dataclass
class Caps:
    options: frozenset[str]
    package: str = "sglang"
    version: str = "0.5.23"


UPSTREAM = Caps(frozenset({"--host", "--port", "--model-path", "--model", "--tp-size",
                           "--kt-weight-path", "--kt-cpuinfer", "--kt-method"}))  # fmt: skip


def spec(*extra: str, port: int = 0, path: str = "/m") -> ModelSpec:
    return ModelSpec(alias="m", backend="kt", path=path, served=True, source="t",
                     extra_args=tuple(extra), port=port)  # fmt: skip


def test_flags_unknown_to_sglang_are_named() -> None:
    msg = preflight.check_flags(spec("--kt-numa-nodes", "0", "--tp", "2"), UPSTREAM)
    assert msg is not None and "--kt-numa-nodes" in msg and "sglang 0.5.23" in msg
    assert "--tp," not in msg  # a unique prefix of --tp-size, as argparse accepts


def test_flags_unknown_capabilities_never_refuse() -> None:
    assert preflight.check_flags(spec("--anything"), None) is None
    assert preflight.capabilities_of(object()) is None

    class Probe:
        capabilities = UPSTREAM

    assert preflight.capabilities_of(Probe()) is UPSTREAM


def test_problems_are_collected_in_one_message(tmp_path: Path) -> None:
    s = spec("--nope", port=8123, path=str(tmp_path / "gone"))
    facts = preflight.Facts(
        model_path=preflight.PathFacts(s.path, False),
        kt_weight_path=preflight.PathFacts("/w", True, True, False),
        config_error=None,
        port_free=False,
    )
    found = preflight.problems(s, facts, UPSTREAM)
    assert len(found) == 4
    text = preflight.message(found)
    assert "does not exist" in text and "not readable" in text and "--nope" in text
    assert "8123" in text and text.endswith("(no engine was stopped)")


def test_gather_reads_the_real_files(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    facts = preflight.gather(spec(path=str(model)))
    assert facts.model_path.exists and facts.config_error and "not valid JSON" in facts.config_error
    (model / "config.json").write_text('{"num_hidden_layers": 2}')
    assert preflight.gather(spec(path=str(model))).config_error is None
