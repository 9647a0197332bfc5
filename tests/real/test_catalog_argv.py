"""Every built-in catalog variant's flags, as ktd derives them for the AMX box (the
catalog's, the derived and placement's), parse with sglang-kt's own argparse to the
values meant: a misspelt flag or parser name in ``ktd/catalog/builtin.json`` fails here,
not at a user's launch (issue 44)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktd.catalog.flags import derive
from ktd.catalog.load import load
from ktd.core.userflags import user_flags
from tests.catalog.machines import amx_box
from tests.real.test_argv_conformance import parse_all


def test_every_catalog_variants_flags_parse_with_sglang_kt(
    real_env: dict[str, str], venv_python: Any, tmp_path: Path
) -> None:
    topo = amx_box(tmp_path / "box")
    cases = []
    for e in load().entries:
        for v in e.variants:
            d = derive(e, v, topo, weights_numa=2)
            argv = ["--model-path", "/m", "--kt-weight-path", "/m", *d.extra_args(placement=True)]
            cases.append((f"{e.name}/{v.name}", argv))
    results = parse_all(venv_python(kt=True), real_env, [argv for _, argv in cases])
    for (name, argv), got in zip(cases, results, strict=True):
        assert got["ok"], (name, got.get("error"))
        flags = user_flags(argv)
        args = got["args"]
        assert args["kt_method"] == flags["--kt-method"][-1], name
        for flag in ("--tool-call-parser", "--reasoning-parser", "--attention-backend"):
            if flag in flags:
                assert args[flag[2:].replace("-", "_")] == flags[flag][-1], (name, flag)
