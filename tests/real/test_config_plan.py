"""A config change's plan asks the real ``sglang-kt`` 0.7.2 argparse about its flags (issue 39).

The daemon's config desk, in process (a real pool, not running), with a model whose
interpreter is the installed kt fork's venv: ``ktctl config plan`` of a flag that
SGLang does not have, or of a value outside a flag's choices, is an error naming
models.json's field and the package and version that refuse it, read through the same
probe a launch uses; a flag it has passes. No server is started.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ktd.core import configtext
from ktd.core.configload import parse_config, read_config_texts
from ktd.daemon.config.desk import ConfigDesk
from ktd.daemon.config.history import History
from ktd.daemon.pool.pool import Pool
from tests.real import engine_env


async def test_the_plan_asks_the_real_argparse(venv_python: Any, tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    entry = {
        "path": engine_env.model_dir(),
        "backend": "kt",
        "alias": "real-kt",
        "numa": "none",
        "kt": {"python": venv_python(kt=True), "extra_env": engine_env.engine_env(base={})},
    }
    (etc / "models.json").write_text(json.dumps([entry], indent=2) + "\n")
    (etc / "config.json").write_text('{"models_file": "models.json"}\n')
    texts = read_config_texts(etc / "config.json")
    config = parse_config(texts)
    pool = Pool(config, log_dir=tmp_path / "logs", publish=lambda t, e: None)
    desk = ConfigDesk(config, texts, pool, install=pool.apply_config, history=History(None, 21))
    base = (await desk.get(None)).version
    text = texts.models.decode() if texts.models else ""

    def plan_of(args: list[str]) -> Any:
        return desk.plan(
            None, configtext.set_fields(text, "real-kt", {"kt.extra_args": args}), base
        )

    unknown = await plan_of(["--kt-method", "AMXINT4", "--no-such-flag", "1"])
    [problem] = [q for q in unknown.problems if q.level == "error"]
    assert problem.path == "$[0].kt.extra_args" and problem.file.endswith("models.json")
    assert problem.message == "extra_args --no-such-flag: not an option of sglang-kt 0.7.2"
    choice = await plan_of(["--dtype", "float7"])
    [problem] = [q for q in choice.problems if q.level == "error"]
    assert "--dtype: invalid choice 'float7' for sglang-kt 0.7.2" in problem.message
    good = await plan_of(["--kt-method", "AMXINT4", "--kt-num-gpu-experts", "0"])
    assert good.ok, good.problems
    assert [(e.alias, e.action) for e in good.engines] == [("real-kt", "update")]
