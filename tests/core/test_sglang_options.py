"""argparse's lookup rules against an SGLang option catalogue, and the argv built from it.

The catalogue here is a small excerpt written like the probe's output; the
same rules are checked against the real argparse of both SGLang packages in
``tests/real/test_argv_conformance.py``.
"""

from __future__ import annotations

import pytest

from ktd.core.command import LaunchError, build_launch, planner_args
from ktd.core.config import ModelSpec
from ktd.core.sglang_options import Option, OptionError, SGLangOptions, parse_user_args
from tests.fixtures.specs import kt_spec


def _opt(*flags: str, dest: str, nargs: int | str | None = None, **kw: object) -> Option:
    return Option(flags=flags, dest=dest, nargs=nargs, **kw)  # type: ignore[arg-type]


COMMON = (
    _opt("--model-path", "--model", dest="model_path", type="str"),
    _opt("--host", dest="host"),
    _opt("--port", dest="port", type="int"),
    _opt("--served-model-name", dest="served_model_name"),
    _opt("--context-length", dest="context_length", type="int"),
    _opt("--tensor-parallel-size", "--tp-size", dest="tensor_parallel_size", type="int"),
    _opt("--nnodes", dest="nnodes", type="int"),
    _opt("--node-rank", dest="node_rank", type="int"),
    _opt("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr"),
    _opt("--disable-cuda-graph", dest="disable_cuda_graph", nargs=0, action="storetrue"),
    _opt("--kt-weight-path", dest="kt_weight_path"),
    _opt("--kt-method", dest="kt_method"),
    _opt("--kt-cpuinfer", dest="kt_cpuinfer", type="int"),
    _opt("--kt-threadpool-count", dest="kt_threadpool_count", type="int"),
    _opt("--kt-num-gpu-experts", dest="kt_num_gpu_experts", type="int"),
)
FORK_ONLY = (
    _opt("--kt-numa-nodes", dest="kt_numa_nodes", nargs="+", type="int"),
    _opt(
        "--kt-expert-placement-strategy",
        dest="kt_expert_placement_strategy",
        choices=("frequency", "front-loading", "uniform", "random"),
    ),
)
UPSTREAM = SGLangOptions("sglang", "0.5.23", COMMON)
FORK = SGLangOptions("sglang-kt", "0.7.2", COMMON + FORK_ONLY)


def spec(**fields: object) -> ModelSpec:
    return kt_spec(**{"alias": "ds", "ctx": 4096, "python": "/py", **fields})


def test_lookup_follows_argparse() -> None:
    assert FORK.lookup("--tp-size")[1] == "--tp-size"  # type: ignore[index]
    assert FORK.lookup("--tp")[0].dest == "tensor_parallel_size"  # type: ignore[index]
    assert FORK.lookup("--kt-numa")[0].dest == "kt_numa_nodes"  # type: ignore[index]
    opt, flag, value = FORK.lookup("--kt-cpu=8")  # type: ignore[misc]
    assert (opt.dest, flag, value) == ("kt_cpuinfer", "--kt-cpuinfer", "8")
    assert FORK.lookup("8") is None and FORK.lookup("-1") is None  # values, not options
    with pytest.raises(OptionError, match="ambiguous"):
        FORK.lookup("--kt-n")  # --kt-numa-nodes, --kt-num-gpu-experts
    with pytest.raises(OptionError, match=r"not an option of sglang 0\.5\.23"):
        UPSTREAM.lookup("--kt-numa-nodes")


def test_parse_user_args_reads_values_like_argparse() -> None:
    flags = parse_user_args(["--kt-numa", "0", "1", "--disable-cuda-graph", "--tp=2"], FORK)
    assert [(f.dest, f.written, f.values) for f in flags] == [
        ("kt_numa_nodes", "--kt-numa-nodes", ("0", "1")),
        ("disable_cuda_graph", "--disable-cuda-graph", ()),
        ("tensor_parallel_size", "--tp-size", ("2",)),
    ]
    with pytest.raises(OptionError, match="expects one value"):
        parse_user_args(["--kt-method"], FORK)
    with pytest.raises(OptionError, match="a value with no option"):
        parse_user_args(["--kt-method", "AMXINT4", "stray"], FORK)
    with pytest.raises(OptionError, match="invalid choice 'best'"):
        parse_user_args(["--kt-expert-placement-strategy", "best"], FORK)
    with pytest.raises(OptionError, match="takes no value"):
        parse_user_args(["--disable-cuda-graph=1"], FORK)


def test_abbreviated_user_flag_wins_and_is_never_doubled() -> None:
    s = spec(tp_size=4, extra_args=("--tp", "2", "--kt-threadpool", "1"))
    argv = build_launch(
        s, 1, ["--kt-numa-nodes", "0", "--kt-threadpool-count", "1", "--kt-cpuinfer", "8"], FORK
    ).argv
    assert "--tp-size" not in argv and "--kt-threadpool-count" not in argv
    assert argv[-4:] == ["--tp", "2", "--kt-threadpool", "1"]
    assert argv[argv.index("--kt-cpuinfer") + 1] == "8"
    # The planner sees the user's flags spelled ktd's way, so their values place the engine.
    assert planner_args(s.extra_args, FORK) == ("--tp-size", "2", "--kt-threadpool-count", "1")


def test_flags_unknown_to_upstream_are_left_out_with_a_note() -> None:
    launch = build_launch(
        spec(), 1, ["--kt-numa-nodes", "0", "--kt-threadpool-count", "1"], UPSTREAM
    )
    assert "--kt-numa-nodes" not in launch.argv
    assert launch.argv[launch.argv.index("--kt-threadpool-count") + 1] == "1"
    assert launch.notes == ("--kt-numa-nodes left out: not an option of sglang 0.5.23",)


def test_refusals_name_the_flag_and_the_sglang() -> None:
    with pytest.raises(LaunchError, match=r"extra_args --kt-numa-nodes: not an option of sglang"):
        build_launch(spec(extra_args=("--kt-numa-nodes", "0")), 1, (), UPSTREAM)
    with pytest.raises(LaunchError, match="ktd sets this flag from the config's `port`"):
        build_launch(spec(extra_args=("--po", "9")), 1, (), FORK)
    with pytest.raises(LaunchError, match="cannot span hosts"):
        build_launch(spec(extra_args=("--nnodes", "2")), 1, (), FORK)
    no_kt = SGLangOptions(
        "sglang", "0.4.0", tuple(o for o in COMMON if not o.dest.startswith("kt_"))
    )
    with pytest.raises(LaunchError, match="install the kt fork there"):
        build_launch(spec(), 1, (), no_kt)
    assert "--kt-weight-path" not in build_launch(spec(kt_weight_path=None), 1, (), no_kt).argv


def test_no_catalogue_keeps_the_seed_form() -> None:
    argv = build_launch(spec(extra_args=("--kt-cpuinfer", "4")), 7, ["--kt-cpuinfer", "8"]).argv
    assert argv[:9] == ["/py", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "7",
                        "--model", "/m/ds"]  # fmt: skip
    assert argv.count("--kt-cpuinfer") == 1 and argv[-2:] == ["--kt-cpuinfer", "4"]
