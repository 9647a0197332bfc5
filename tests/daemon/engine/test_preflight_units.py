"""Preflight checks (pure) and the SGLang flag hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktd.core.config import ModelSpec
from ktd.core.sglang_options import Option, SGLangOptions
from ktd.daemon.engine import preflight


def _opt(*flags: str, dest: str, **kw: Any) -> Option:
    return Option(flags=flags, dest=dest, **kw)


UPSTREAM = SGLangOptions(
    "sglang",
    "0.5.23",
    (
        _opt("--model-path", "--model", dest="model_path"),
        _opt("--host", dest="host"),
        _opt("--port", dest="port", type="int"),
        _opt("--served-model-name", dest="served_model_name"),
        _opt("--context-length", dest="context_length", type="int"),
        _opt("--tensor-parallel-size", "--tp-size", dest="tensor_parallel_size", type="int"),
        _opt("--kt-weight-path", dest="kt_weight_path"),
        _opt("--kt-method", dest="kt_method"),
    ),
)


def spec(*extra: str, port: int = 0, path: str = "/m") -> ModelSpec:
    return ModelSpec(alias="m", backend="kt", path=path, served=True, source="t",
                     extra_args=tuple(extra), port=port)  # fmt: skip


def test_flags_unknown_to_sglang_are_named() -> None:
    msg = preflight.check_flags(spec("--kt-numa-nodes", "0", "--tp", "2"), UPSTREAM)
    assert msg is not None and "--kt-numa-nodes" in msg and "sglang 0.5.23" in msg
    # a unique prefix of --tp-size / --tensor-parallel-size, as argparse accepts:
    assert preflight.check_flags(spec("--tensor", "2"), UPSTREAM) is None


def test_flags_unknown_capabilities_never_refuse() -> None:
    assert preflight.check_flags(spec("--anything"), None) is None
    assert preflight.capabilities_of(object()) is None

    class Probe:
        catalog = UPSTREAM

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


def test_a_pulled_directory_must_be_verified(tmp_path: Path) -> None:
    """A path ktd pulled (``.ktd`` beside its files) loads only once its pull finished
    with every checksum matching; a path ktd did not pull is not asked."""
    from ktd.catalog import verify

    model = tmp_path / "org--m" / "main"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"num_hidden_layers": 2}')
    assert preflight.gather(spec(path=str(model))).pulls == ()  # not a pull
    (model / ".ktd").mkdir()
    found = preflight.problems(spec(path=str(model)), preflight.gather(spec(path=str(model))), None)
    assert len(found) == 1 and "is not verified" in found[0] and "no verified pull" in found[0]
    checked = (verify.Checked(name="config.json", size=24),)
    bad = verify.Marker(repo="org/m", revision="main", commit="c", files=checked,
                        problems=("model.safetensors: sha256 aa, the hub says bb",))  # fmt: skip
    verify.write_marker(model, bad)
    found = preflight.problems(spec(path=str(model)), preflight.gather(spec(path=str(model))), None)
    assert "model.safetensors: sha256 aa, the hub says bb" in found[0]
    good = verify.Marker(repo="org/m", revision="main", commit="c", files=checked)
    verify.write_marker(model, good)
    assert preflight.gather(spec(path=str(model))).pulls == ()
