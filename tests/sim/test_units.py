"""The sim's pure parts: knobs, flags, the deterministic "model", the record's env selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktd.sim import gen
from ktd.sim.cli import DEFAULT_CONTEXT_LENGTH, parse
from ktd.sim.knobs import Knobs
from ktd.sim.record import selected_env


def test_knobs_defaults_and_bad_values() -> None:
    knobs, warnings = Knobs.from_env({})
    assert knobs == Knobs() and warnings == []
    assert (knobs.load_time, knobs.warmup, knobs.drain, knobs.hang_after) == (0.3, 0.1, 5.0, None)
    knobs, warnings = Knobs.from_env(
        {
            "KTD_SIM_LOAD_TIME": "fast",
            "KTD_SIM_TOKEN_RATE": "-3",
            "KTD_SIM_HANG_AFTER": "2.5",
            "KTD_SIM_CRASH_MID_STREAM": "4",
            "KTD_SIM_ESCAPE": "yes",
            "KTD_SIM_NEVER_HEALTHY": "maybe",
        }
    )
    assert knobs.load_time == 0.3 and knobs.token_rate == 0.0  # bad values: defaults
    assert knobs.hang_after == 2.5 and knobs.crash_mid_stream == 4 and knobs.escape
    assert not knobs.never_healthy
    assert len(warnings) == 3


def test_orphan_knob_takes_term_or_ignore() -> None:
    assert Knobs.from_env({"KTD_SIM_ORPHAN": "Ignore"}) == (Knobs(orphan="ignore"), [])
    assert Knobs.from_env({"KTD_SIM_ORPHAN": "term"})[0].orphan == "term"
    knobs, warnings = Knobs.from_env({"KTD_SIM_ORPHAN": "yes"})
    assert knobs.orphan == "" and warnings == ["KTD_SIM_ORPHAN='yes' is not one of term, ignore"]


def test_flags_like_launch_server() -> None:
    args = parse(["--model", "/m", "--kt-numa-nodes", "0", "1", "--tp", "2"], "kt")
    assert (args.host, args.port) == ("127.0.0.1", 30000)
    assert args.context_length == DEFAULT_CONTEXT_LENGTH
    assert args.served_model_name == "/m" and args.tokenizer_path == "/m"
    assert args.server_args["kt_numa_nodes"] == [0, 1] and args.tp_size == 2
    assert args.access_log
    assert not parse(["--model-path", "/m", "--log-level-http", "warning"]).access_log


@pytest.mark.parametrize(
    ("which", "argv", "message"),
    [
        ("upstream", ["--kt-numa-nodes", "0"], "unrecognized arguments: --kt-numa-nodes 0"),
        ("kt", ["--kt-numa-nodes", "0,1"], "invalid int value: '0,1'"),
        ("kt", ["--kt-expert-placement-strategy", "best"], "invalid choice: 'best'"),
        ("kt", ["--kt-n", "1"], "ambiguous option: --kt-n could match"),
        ("kt", ["--some-future-flag", "7"], "unrecognized arguments: --some-future-flag 7"),
    ],
)
def test_flags_are_as_strict_as_sglang(
    which: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real SGLang's plain argparse exits 2 on these (docs/sglang.md); so does the sim."""
    with pytest.raises(SystemExit) as exit_:
        parse(["--model", "/m", *argv], which)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_plan_finish_reasons() -> None:
    assert gen.plan(3).text() == "tok0 tok1 tok2"
    assert (gen.plan(3).finish_reason, gen.plan(3).matched_stop) == ("length", None)
    natural = gen.plan(None)
    assert natural.n_tokens == gen.NATURAL_TOKENS and natural.matched_stop == gen.EOS_TOKEN_ID
    cut = gen.plan(10, ["k3 t"])
    assert cut.text() == "tok0 tok1 tok2 to" and cut.matched_stop == "k3 t"
    assert cut.n_tokens == 5  # the stop string ends inside token 4
    assert gen.plan(5, ["nowhere"]).finish_reason == "length"
    assert gen.count_content([{"type": "text", "text": "a b"}, {"type": "image_url"}]) == 2
    assert gen.count_prompt([1, 2, 3]) == 3
    assert gen.embedding("x") == gen.embedding("x") != gen.embedding("y")


def test_record_env_selection() -> None:
    env = {
        "KT_A": "1",
        "KTD_SIM_X": "2",
        "SGLANG_Y": "3",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_HOME": "/cuda",
        "PATH": "/bin",
    }
    assert selected_env(env) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "KTD_SIM_X": "2",
        "KT_A": "1",
        "SGLANG_Y": "3",
    }


def _model(tmp_path: Path, **config: Any) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_context_length_is_derived_as_sglang_derives_it(tmp_path: Path) -> None:
    from ktd.sim.cli import derived_context_length

    assert derived_context_length(_model(tmp_path, max_position_embeddings=256)) == 256
    first = _model(tmp_path, seq_length=100, max_position_embeddings=256)
    assert derived_context_length(first) == 100  # SGLang's key order
    scaled = {"factor": 4.0, "rope_type": "yarn"}
    assert (
        derived_context_length(_model(tmp_path, max_position_embeddings=1000, rope_scaling=scaled))
        == 4000
    )
    original = {"factor": 4.0, "original_max_position_embeddings": 1000}
    assert (
        derived_context_length(
            _model(tmp_path, max_position_embeddings=1000, rope_scaling=original)
        )
        == 1000
    )
    nested = _model(tmp_path, text_config={"max_position_embeddings": 777})
    assert derived_context_length(nested) == 777
    assert derived_context_length(_model(tmp_path, hidden_size=8)) == 2048
    assert derived_context_length(str(tmp_path / "none")) is None


def test_a_longer_context_than_the_model_s_is_refused_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model(tmp_path, max_position_embeddings=256)
    assert parse(["--model", model]).context_length == 256
    assert parse(["--model", model, "--context-length", "128"]).context_length == 128
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    with pytest.raises(SystemExit) as ended:
        parse(["--model", model, "--context-length", "4096"])
    assert ended.value.code == 1
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in capsys.readouterr().err
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    assert parse(["--model", model, "--context-length", "4096"]).context_length == 4096


@pytest.mark.parametrize(
    ("word", "tokens"), [("256", 256), ("0.25k", 250), ("1Ki", 1024), (" 2k ", 2000)]
)
def test_upstream_reads_the_context_length_as_a_human_readable_int(
    tmp_path: Path, word: str, tokens: int
) -> None:
    """Upstream 0.5.23 types ``--context-length`` with ``human_readable_int``; the kt fork
    with plain ``int``, so a suffix is a usage error there."""
    model = _model(tmp_path, max_position_embeddings=4096)
    argv = ["--model", model, "--context-length", word]
    assert parse(argv, which="upstream").context_length == tokens
    if word.strip().isdigit():
        assert parse(argv, which="kt").context_length == tokens
    else:
        with pytest.raises(SystemExit) as ended:
            parse(argv, which="kt")
        assert ended.value.code == 2


@pytest.mark.parametrize("word", ["1.5Ki", "2K", "lots"])
def test_upstream_refuses_a_size_it_cannot_read(
    tmp_path: Path, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model(tmp_path, max_position_embeddings=4096)
    with pytest.raises(SystemExit) as ended:
        parse(["--model", model, "--context-length", word], which="upstream")
    assert ended.value.code == 2
    assert "--context-length" in capsys.readouterr().err
