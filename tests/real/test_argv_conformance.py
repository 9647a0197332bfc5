"""Every argv shape ktd can build, parsed by the real argparse of ``sglang`` and ``sglang-kt``.

No server is started: each package's own ``ServerArgs.add_cli_args`` parses
every argv (``parse_argv.py`` in that venv), and the parsed values must be the
ones ktd meant: the config's fields, the plan's placement flags (unless the
user set them, however abbreviated), and the user's extra_args. What ktd
refuses to launch (a flag this SGLang does not know) must be what that
argparse rejects. The catalogue ktd builds argv from is the live probe of each
venv, and the sim's copy of it must be the same data.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ktd.core.command import LaunchError, build_launch, planner_args, read_user_args, spelling
from ktd.core.config import ModelSpec
from ktd.core.placement import plan
from ktd.core.sglang_options import Option, SGLangOptions
from ktd.core.topology import Topology
from ktd.daemon.engine.probe import ProbeResult
from ktd.topology import read_topology
from tests.fixtures.topology import (
    FakeRun,
    build,
    build_epyc,
    build_laptop,
    smi_csv,
    xeon_machine,
)

HERE = Path(__file__).resolve().parent
SIM_OPTIONS = HERE.parent.parent / "ktd" / "sim" / "options"


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


USER_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "full": words(
        "--kt-method AMXINT8 --kt-cpuinfer 8 --tp-size 2 --kt-num-gpu-experts 4 "
        "--disable-cuda-graph"
    ),
    "abbreviated": words(
        "--kt-cpu 8 --tp 2 --kt-method=AMXINT8 --kt-num-gpu 4 --mem-fraction-static 0.8"
    ),
    "fork-placement": words("--kt-numa 0 --kt-threadpool 1"),
    "fork-tuning": words(
        "--kt-expert-placement-strategy frequency --kt-gpu-prefill-token-threshold 4096 "
        "--kt-max-deferred 2"
    ),
}
OVERRIDES: dict[str, dict[str, Any]] = {
    "seed": {"ctx": 32768, "kt_weight_path": "/m/ds-kt"},
    "bare": {"ctx": 0, "kt_weight_path": None, "tp_size": 2},
}
NUMA: list[Any] = ["auto", "all", [0], [0, 1], "none"]


def topologies(tmp: Path) -> dict[str, Topology]:
    h100 = [(0, "NVIDIA H100", 81559, 0), (1, "NVIDIA H100", 81559, 0)]
    l40s = [(i, "NVIDIA L40S", 46068, 0) for i in range(4)]
    return {
        "laptop": read_topology(build_laptop(tmp / "laptop"), nvidia_smi=None),
        "xeon": read_topology(build(tmp / "xeon", xeon_machine()), run=FakeRun(smi_csv(h100))),
        "epyc": read_topology(build_epyc(tmp / "epyc"), run=FakeRun(smi_csv(l40s))),
        "this-machine": read_topology(nvidia_smi=None),
    }


def live_catalog(python: str, env: dict[str, str]) -> tuple[ProbeResult, SGLangOptions]:
    from ktd.daemon.engine.probe import PROBE_CODE, parse_probe_output

    r = subprocess.run(
        [python, "-c", PROBE_CODE], env=env, capture_output=True, text=True, timeout=600
    )
    res = parse_probe_output(python, r.returncode, r.stdout + r.stderr)
    assert res.catalog is not None, (
        f"{python}: {res.options_error or res.error}\n{r.stderr[-2000:]}"
    )
    return res, res.catalog


def typed(option: Option, values: Sequence[str]) -> Any:
    conv = {"int": int, "float": float}.get(option.type or "str", str)
    if option.nargs == 0:
        return "store_false" not in option.action
    if option.nargs in ("+", "*"):
        return [conv(v) for v in values]
    return conv(values[0])


def spec(alias: str, extra: tuple[str, ...], over: dict[str, Any]) -> ModelSpec:
    fields: dict[str, Any] = dict(
        alias=alias, backend="kt", path="/m/ds", served=True, source="t", python="/py",
        extra_args=extra,
    )  # fmt: skip
    fields.update(over)
    return ModelSpec(**fields)


def shapes(catalog: SGLangOptions, topos: dict[str, Topology]) -> list[dict[str, Any]]:
    """Every (machine, numa, user args, overrides) ktd can launch, with what it meant."""
    out: list[dict[str, Any]] = []
    for (tname, topo), numa, (uname, extra), (oname, over) in itertools.product(
        topos.items(), NUMA, USER_ARGS.items(), OVERRIDES.items()
    ):
        s = spec(f"{tname}-{uname}-{oname}", extra, over)
        case: dict[str, Any] = {"id": f"{tname}/{numa}/{uname}/{oname}"}
        try:
            p = plan(s.alias, numa, "auto", planner_args(extra, catalog), topo, (),
                     tp_size=s.tp_size)  # fmt: skip
            if not p.ok:
                continue  # e.g. two NUMA nodes asked of a one-node machine: nothing launched
            launch = build_launch(s, 30123, p.argv_flags(), catalog)
        except LaunchError as exc:
            case["refused"] = str(exc)
            case["argv"] = [*build_launch(spec(s.alias, (), over), 30123).argv[3:], *extra]
            out.append(case)
            continue
        meant: dict[str, Any] = {}
        for flag, value in (("--host", "127.0.0.1"), ("--port", "30123"), ("--model", "/m/ds"),
                            ("--served-model-name", s.alias)):  # fmt: skip
            opt = catalog.exact(flag)
            assert opt is not None
            meant[opt.dest] = typed(opt, [value])
        if s.ctx:
            meant[catalog.exact("--context-length").dest] = s.ctx  # type: ignore[union-attr]
        if s.kt_weight_path:
            meant["kt_weight_path"] = s.kt_weight_path
        if s.tp_size:
            meant[catalog.exact("--tp-size").dest] = s.tp_size  # type: ignore[union-attr]
        for f in p.flags:  # the plan's, unless this SGLang does not know them
            opt = catalog.exact(f.name)
            if opt is not None:
                meant[opt.dest] = typed(opt, f.values)
        for uf in read_user_args(extra, catalog):  # the user's word wins, whatever its spelling
            meant[uf.dest] = typed(uf.option, uf.values)
        case.update(argv=launch.argv[3:], meant=meant, notes=list(launch.notes))
        out.append(case)
    return out


def parse_all(python: str, env: dict[str, str], argvs: list[list[str]]) -> list[dict[str, Any]]:
    r = subprocess.run(
        [python, str(HERE / "parse_argv.py")],
        input=json.dumps(argvs),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def probed(
    real_env: dict[str, str], venv_python: Any
) -> dict[bool, tuple[ProbeResult, SGLangOptions]]:
    """ktd's own probe of each venv, once (importing SGLang's server_args takes ~20 s)."""
    return {kt: live_catalog(venv_python(kt=kt), real_env) for kt in (False, True)}


@pytest.mark.parametrize("kt", [False, True], ids=["sglang", "sglang-kt"])
def test_every_argv_ktd_builds_parses_as_meant(
    kt: bool,
    real_env: dict[str, str],
    venv_python: Any,
    probed: dict[bool, tuple[ProbeResult, SGLangOptions]],
    tmp_path: Path,
) -> None:
    python = venv_python(kt=kt)
    probe, catalog = probed[kt]
    assert (probe.sglang_package, probe.sglang) == (
        ("sglang-kt", "0.7.2") if kt else ("sglang", "0.5.23")
    )
    assert catalog.kt_fork is kt
    # The sim plays exactly this SGLang: its option data is this probe's output.
    name = "sglang-kt-0.7.2.json" if kt else "sglang-0.5.23.json"
    shipped = msgspec.json.decode((SIM_OPTIONS / name).read_bytes())
    live = msgspec.json.decode(msgspec.json.encode(probe.options))
    assert shipped == live, f"refresh ktd/sim/options/{name}"

    cases = shapes(catalog, topologies(tmp_path))
    results = parse_all(python, real_env, [c["argv"] for c in cases])
    refused = launched = 0
    for case, got in zip(cases, results, strict=True):
        if "refused" in case:
            refused += 1
            # What ktd refuses, this SGLang's argparse rejects (exit 2) — or ktd owns it.
            assert not got["ok"] or "ktd sets this flag" in case["refused"], case
            continue
        launched += 1
        assert got["ok"], (case["id"], case["argv"], got)
        wrong = {
            k: (v, got["args"].get(k)) for k, v in case["meant"].items() if got["args"].get(k) != v
        }
        assert not wrong, (case["id"], case["argv"], wrong)
    assert launched > 100
    if kt:
        assert refused == 0  # the fork knows every flag ktd and these users write
    else:  # upstream knows no --kt-numa-nodes and none of the fork's tuning flags
        assert refused > 0
        left_out = [c for c in cases if c.get("notes")]
        assert left_out and all("--kt-numa-nodes left out" in c["notes"][0] for c in left_out)


def test_spelling_is_stable_across_both_packages(
    probed: dict[bool, tuple[ProbeResult, SGLangOptions]],
) -> None:
    """The dests differ (``tp_size`` vs ``tensor_parallel_size``), ktd's spelling does not."""
    dests = set()
    for _probe, catalog in probed.values():
        tp = catalog.exact("--tp-size")
        assert tp is not None and spelling(tp) == "--tp-size"
        dests.add(tp.dest)
    assert dests == {"tp_size", "tensor_parallel_size"}
