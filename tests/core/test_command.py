"""The engine command line: exactly the seed's argv, flags left out when unset."""

from __future__ import annotations

from ktd.core.command import ENGINE_MARK, build_argv, build_env, user_flag_names
from tests.fixtures.specs import kt_spec as spec


def test_seed_argv_exactly() -> None:
    argv = build_argv(spec(extra_args=("--tp-size", "1")), 30001)
    assert argv == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--model",
        "/m/ds",
        "--kt-weight-path",
        "/m/ds-kt",
        "--served-model-name",
        "deepseek-v4-kt",
        "--context-length",
        "32768",
        "--tp-size",
        "1",
    ]


def test_unset_values_leave_their_flag_out() -> None:
    argv = build_argv(spec(ctx=0, kt_weight_path=None), 1)
    assert "--context-length" not in argv and "--kt-weight-path" not in argv


def test_placement_flags_go_before_extra_args() -> None:
    argv = build_argv(
        spec(extra_args=("--kt-method", "AMXINT4")),
        1,
        ["--kt-numa-nodes", "0", "1", "--kt-threadpool-count", "2"],
    )
    i = argv.index("--kt-numa-nodes")
    assert argv[i : i + 5] == ["--kt-numa-nodes", "0", "1", "--kt-threadpool-count", "2"]
    assert argv[-2:] == ["--kt-method", "AMXINT4"]


def test_model_fields_become_flags_unless_user_set_them() -> None:
    argv = build_argv(spec(tp_size=2, nnodes=1, extra_args=("--tp-size=4",)), 1)
    assert "--tp-size" not in argv and "--tp-size=4" in argv
    assert argv[argv.index("--nnodes") + 1] == "1"


def test_env_layers() -> None:
    s = spec(extra_env=(("CUDA_VISIBLE_DEVICES", "3"), ("KT_X", "1")))
    env = build_env(
        s, {"PATH": "/bin", "KTD_SOCKET": "x"}, {"CUDA_VISIBLE_DEVICES": "0"}, engine_id="id1"
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the user's word wins
    assert env["KT_X"] == "1" and env["PATH"] == "/bin" and "KTD_SOCKET" not in env
    assert env[ENGINE_MARK] == "id1"


def test_user_flag_names() -> None:
    assert user_flag_names(["--a", "1", "--b=2", "x", "-c"]) == {"--a", "--b"}


def test_sleep_adds_the_memory_saver_only_when_the_sglang_declares_it() -> None:
    import msgspec

    from ktd.core.command import SLEEP_FLAGS, build_launch
    from ktd.core.sglang_options import CatalogData, SGLangOptions
    from ktd.sim.flags import catalog

    launch = build_launch(spec(sleep=True), 30000)  # no catalogue: by name
    assert launch.sleeps and all(f in launch.argv for f in SLEEP_FLAGS)
    real = SGLangOptions.from_data(msgspec.convert(catalog("kt"), CatalogData))
    launch = build_launch(spec(sleep=True), 30000, (), real)
    assert launch.sleeps and "--enable-memory-saver" in launch.argv
    assert not build_launch(spec(), 30000, (), real).sleeps  # off unless configured
    old = SGLangOptions("sglang", "0.4.0", tuple(o for o in real.options if "saver" not in o.dest))
    launch = build_launch(spec(sleep=True), 30000, (), old)
    assert not launch.sleeps and "--enable-memory-saver" not in launch.argv
    assert any(n.startswith("sleep off:") for n in launch.notes)
