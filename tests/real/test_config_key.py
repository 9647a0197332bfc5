"""The engine's key file (issue 32), read by the real argparse of ``sglang`` and ``sglang-kt``.

ktd hands each engine its API key in a 0600 YAML file read with ``--config``, never
on the command line. Each package's own ``ConfigArgumentMerger`` and argparse
(``parse_argv.py`` in that venv) read the very files ktd writes (its own key, a user's),
and a set of other files that show how the merge goes (the key's spelling, booleans, a
mapping, an action the merger refuses, a bad suffix, the command line winning); the sim
(``ktd.sim.configfile``) must read every one of them the same way. No server is
started here; ``test_real_server.py`` checks that the real server started by ktd
refuses a request without the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ktd.core.command import with_key_file
from ktd.daemon.engine.key import KeyDir, new_key
from ktd.sim import cli
from tests.real.test_argv_conformance import parse_all

#: A user's own key, with what YAML and a shell would both trip on.
USER_KEY = 'sk-a "quoted" key: with # and \\ and ü'
#: name -> (file name, YAML text, extra command line); the file is passed last.
CASES: dict[str, tuple[str, str, list[str]]] = {
    "api_key spelled as the dest": ("a.yml", 'api_key: "k"\n', []),
    "store_true on and off": ("b.yaml", "enable-metrics: true\nskip-server-warmup: false\n", []),
    "a mapping": ("c.yml", 'json-model-override-args: {"a": 1}\n', []),
    "a list for SGLang's own action": ("d.yml", "lora-paths: [a]\n", []),
    "a list at the root": ("e.yml", "- 1\n", []),
    "empty": ("f.yml", "", []),
    "not .yaml": ("g.json", "port: 1\n", []),
    "the other spelling of a flag": ("h.yml", "tensor-parallel-size: 2\n", []),
    "the command line wins": ("i.yml", "port: 1111\nserved-model-name: a\n", ["--port", "2222"]),
}
COMPARED = (
    "api_key",
    "admin_api_key",
    "enable_metrics",
    "skip_server_warmup",
    "json_model_override_args",
    "port",
    "served_model_name",
    "tp_size",
    "tensor_parallel_size",
)


def sim_parse(argv: list[str], which: str) -> dict[str, Any]:
    try:
        args = cli.parse(argv, which)
    except SystemExit as exc:
        return {"ok": False, "code": exc.code}
    return {"ok": True, "args": args.server_args}


@pytest.mark.parametrize("kt", [False, True], ids=["sglang", "sglang-kt"])
def test_the_key_file_ktd_writes_and_the_sims_merge_match_the_real_argparse(
    kt: bool, real_env: dict[str, str], venv_python: Any, tmp_path: Path
) -> None:
    key = new_key()
    key_file = KeyDir(tmp_path / "keys").write("tiny", key)
    assert key_file.stat().st_mode & 0o777 == 0o600
    ours = with_key_file(["--model", "/m", "--port", "30123"], str(key_file))
    # A user's own --api-key goes in the file too (any text: ktd quotes it as JSON), and
    # a user's --admin-api-key beside it (issue 40: a sleep's calls want it).
    user_file = KeyDir(tmp_path / "keys").write("user", USER_KEY, admin_key=USER_KEY + "!")
    argvs = [ours, with_key_file(["--model", "/m"], str(user_file))]
    for name, text, extra in CASES.values():
        path = tmp_path / name
        path.write_text(text)
        argvs.append(["--model", "/m", *extra, "--config", str(path)])
    real = parse_all(venv_python(kt=kt), real_env, argvs)
    assert real[0]["ok"], real[0]
    assert real[0]["args"]["api_key"] == key and real[0]["args"]["port"] == 30123
    assert key not in " ".join(ours)  # the key is in the file alone
    assert real[1]["ok"] and real[1]["args"]["api_key"] == USER_KEY, real[1]
    assert real[1]["args"]["admin_api_key"] == USER_KEY + "!", real[1]
    which = "kt" if kt else "upstream"
    names = ["ktd's key file", "a user's key in the file", *CASES]
    for case, argv, got in zip(names, argvs, real, strict=True):
        sim = sim_parse(argv, which)
        print(f"\n{which} {case}: real {got.get('code', 'ok')}, sim {sim.get('code', 'ok')}")
        assert sim["ok"] == got["ok"], (case, got, sim)
        if not got["ok"]:
            assert sim["code"] == got["code"], (case, got, sim)
            continue
        for dest in COMPARED:
            if dest in got["args"]:
                assert sim["args"].get(dest) == got["args"][dest], (case, dest, got, sim)
    # What the cases show (the same in both packages).
    by_name = dict(zip(CASES, real[2:], strict=True))
    assert by_name["api_key spelled as the dest"]["code"] == 2  # --api_key: no such option
    assert by_name["a list for SGLang's own action"]["code"] == 1  # Unsupported config option
    assert by_name["not .yaml"]["code"] == 1
    assert by_name["the command line wins"]["args"]["port"] == 2222
    assert by_name["the command line wins"]["args"]["served_model_name"] == "a"
