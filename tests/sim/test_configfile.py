"""The sim's ``--config FILE`` and ``--api-key``, as SGLang reads and enforces them (issue 32).

ktd gives each engine its key in a 0600 YAML file read with ``--config``: the sim must
merge it as SGLang's ``ConfigArgumentMerger`` does (``ktd.sim.configfile``), and then
answer as SGLang's key middleware does (``utils/auth.py``). Both are checked against
the real packages' argparse and server in ``tests/real``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ktd.sim import cli

KEY = "0123456789abcdef" * 4


def write(tmp_path: Path, text: str, name: str = "engine.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("which", ["kt", "upstream"])
def test_the_key_file_is_merged_before_the_command_line(tmp_path: Path, which: str) -> None:
    cfg = write(tmp_path, f'api-key: "{KEY}"\nport: 1111\nenable-metrics: true\n')
    args = cli.parse(["--model", "m", "--config", cfg, "--port", "2222"], which)
    assert args.api_key == KEY
    assert args.port == 2222  # the command line wins over the file
    assert args.server_args["enable_metrics"] is True
    assert args.server_args["config"] is None  # consumed by the merge, as SGLang's


@pytest.mark.parametrize("which", ["kt", "upstream"])
def test_what_sglang_refuses_in_a_config_file(
    tmp_path: Path, which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def exit_code(argv: list[str]) -> Any:
        with pytest.raises(SystemExit) as exc:
            cli.parse(argv, which)
        return exc.value.code

    # The key is spelled as the flag: ``--api_key`` is no option (argparse: exit 2).
    assert exit_code(["--model", "m", "--config", write(tmp_path, "api_key: x\n")]) == 2
    # SGLang's ValueErrors (a traceback there, exit 1).
    assert exit_code(["--model", "m", "--config", write(tmp_path, "a: 1\n", "c.json")]) == 1
    assert "must be YAML format" in capsys.readouterr().err
    assert exit_code(["--model", "m", "--config", str(tmp_path / "none.yml")]) == 1
    assert "Config file not found" in capsys.readouterr().err
    assert exit_code(["--model", "m", "--config", write(tmp_path, "- 1\n")]) == 1
    assert "dictionary at root level" in capsys.readouterr().err
    one = write(tmp_path, "port: 1\n")
    assert exit_code(["--model", "m", "--config", one, "--config", one]) == 1
    assert "Multiple config files" in capsys.readouterr().err
    assert exit_code(["--model", "m", "--config"]) == 1
    # SGLang's own actions are no _StoreAction: refused (the sim's parser stores them).
    lora = write(tmp_path, "lora-paths: [a, b]\n")
    assert exit_code(["--model", "m", "--config", lora]) == 1
    assert "Unsupported config option 'lora_paths'" in capsys.readouterr().err
    # A store_true false is simply left out.
    off = write(tmp_path, "enable-metrics: false\n")
    assert (
        cli.parse(["--model", "m", "--config", off], which).server_args["enable_metrics"] is False
    )


def test_the_two_packages_pass_a_mapping_differently(tmp_path: Path) -> None:
    """Upstream 0.5.23 JSON-encodes a mapping value; the kt fork 0.7.2 ``str()``-s it."""
    cfg = write(tmp_path, 'json-model-override-args: {"a": 1}\n')
    up = cli.parse(["--model", "m", "--config", cfg], "upstream")
    kt = cli.parse(["--model", "m", "--config", cfg], "kt")
    assert up.server_args["json_model_override_args"] == '{"a": 1}'
    assert kt.server_args["json_model_override_args"] == "{'a': 1}"


@pytest.mark.parametrize("which", ["kt", "upstream"])
def test_a_keyed_sim_answers_as_sglangs_middleware(
    tmp_path: Path, sim_factory: Any, which: str
) -> None:
    cfg = write(tmp_path, f'api-key: "{KEY}"\n')
    sim = sim_factory(args=["--config", cfg], env={"KTD_SIM_SGLANG": which})
    sim.wait_ready()
    with httpx.Client(timeout=10) as c:
        denied = c.get(sim.url("/v1/models"))
        assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"})
        for wrong in (f"Bearer {KEY}x", KEY, f"Basic {KEY}", f"Bearer  {KEY}"):
            assert c.get(sim.url("/v1/models"), headers={"authorization": wrong}).status_code == 401
        for good in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}"):
            assert c.get(sim.url("/v1/models"), headers={"authorization": good}).status_code == 200
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        assert c.post(sim.url("/v1/chat/completions"), json=chat).status_code == 401
        # Open whatever the key: /health*, /metrics* (a prefix: unknown paths under them
        # reach the router and 404), OPTIONS; upstream also /ready*.
        assert c.get(sim.url("/health")).status_code == 200
        assert c.get(sim.url("/health_generate")).status_code == 200
        assert c.get(sim.url("/metricsx")).status_code == 404
        assert c.options(sim.url("/v1/models")).status_code == 405
        assert c.get(sim.url("/ready")).status_code == (404 if which == "upstream" else 401)
        assert c.get(sim.url("/nowhere")).status_code == 401  # before routing, as SGLang's
        # What SGLang logs first holds the key (ktd masks it in the engine's log).
    assert KEY in sim.log()
