"""What a dashboard page is sent, pure: cards, the machine, and no secret in either."""

from __future__ import annotations

from ktd import protocol as p
from ktd.frontend.ui import view


def test_redact_argv() -> None:
    argv = [
        "python",
        "--api-key",
        "sk-1",
        "--admin-api-key=sk-2",
        "--hf-token",
        "--port",  # a flag right after a secret one is not its value
        "30000",
        "--tp-size",
        "2",
    ]
    assert view.redact_argv(argv) == [
        "python",
        "--api-key",
        view.MASK,
        f"--admin-api-key={view.MASK}",
        "--hf-token",
        "--port",
        "30000",
        "--tp-size",
        "2",
    ]


def test_redact_plan() -> None:
    plan = {
        "argv": ["x", "--api-key", "k"],
        "argv_flags": ["--api-key", "k"],
        "env": {"HF_TOKEN": "t", "CUDA_VISIBLE_DEVICES": "0"},
        "flags": [
            {"name": "--api-key", "values": ["k"], "origin": "user"},
            {"name": "--tp-size", "values": ["1"], "origin": "derived"},
        ],
        "numa_nodes": [0],
    }
    out = view.redact_plan(plan)
    text = repr(out)
    assert "'k'" not in text and "'t'" not in text
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0" and out["numa_nodes"] == [0]
    assert out["flags"][1]["values"] == ["1"]
    assert plan["argv"] == ["x", "--api-key", "k"]  # the input is not changed


def _machine() -> p.MachineReply:
    return p.MachineReply(
        cpu_model="Fake",
        nodes=[
            p.NodeInfo(id=0, cpus=[0, 1, 2, 3], mem_total=100, mem_free=40, mem_available=60),
            p.NodeInfo(id=1, cpus=[4, 5, 6, 7], mem_total=100, mem_free=90, mem_available=90),
        ],
        gpus=[p.GpuInfo(index=0, name="G", memory_total=80, memory_used=10)],
        reserved_cpus=[3],
        holders=[p.Holder(alias="a", state="ready", numa_nodes=[0], cpus=[0, 1, 2], gpus=[0])],
        load_history={"a": [12.0, 10.5]},
    )


def test_build_one_card_per_configured_model_in_config_order() -> None:
    models = [
        p.ModelInfo(alias="a", backend="kt", served=True, path="/m/a", state="ready"),
        p.ModelInfo(
            alias="q", backend="ds4", served=False, path="/m/q", state="not served", reason="no"
        ),
        p.ModelInfo(alias="b", backend="kt", served=True, path="/m/b", state="stopped"),
    ]
    engines = [
        p.EngineInfo(
            alias="a",
            state="ready",
            pid=42,
            argv=["python", "--api-key", "secret"],
            cpus=[0, 1, 2],
            numa_nodes=[0],
            started_at=100.0,
            ttl=600,
            expires_at=700.0,
            in_flight=2,
            queued=1,
        ),
        p.EngineInfo(alias="b", state="stopped"),
        p.EngineInfo(alias="late", state="starting", load_started=5.0, load_eta=60.0),
    ]
    v = view.build(models, engines, _machine())
    cards = v["models"]
    assert [c["alias"] for c in cards] == ["a", "q", "b", "late"]
    assert [c["colour"] for c in cards] == [0, 1, 2, 3]
    a, q, _, late = cards
    assert a["state"] == "ready" and a["pid"] == 42 and a["cpulist"] == "0-2"
    assert a["argv"] == ["python", "--api-key", view.MASK]
    assert (a["started_at"], a["expires_at"], a["in_flight"], a["queued"]) == (100.0, 700.0, 2, 1)
    assert q == {
        "alias": "q",
        "backend": "ds4",
        "served": False,
        "path": "/m/q",
        "colour": 1,
        "state": "not served",
        "reason": "no",
    }
    assert (late["load_started"], late["load_eta"]) == (5.0, 60.0)
    assert v["daemon"] == {"up": True, "error": None}
    assert v["loads"] == {"a": [12.0, 10.5]}
    down = view.build(models, engines, None, daemon_error="gone")
    assert down["daemon"] == {"up": False, "error": "gone"} and down["machine"] is None


def test_machine_names_what_each_engine_holds() -> None:
    m = view.machine(_machine())
    n0, n1 = m["nodes"]
    assert n0["holders"] == ["a"] and n1["holders"] == []
    assert n0["cpulist"] == "0-3" and n0["mem_available"] == 60
    assert m["gpus"][0]["holders"] == ["a"]
    assert m["cpu_owner"] == [[0, "a"], [1, "a"], [2, "a"]]
    assert m["reserved_cpus"] == [3]


def test_an_asleep_card_and_the_host_memory_sleepers_keep_on_their_nodes() -> None:
    """Asleep: no holder (no CPU, no GPU), but its host memory stays on its nodes, split
    evenly; the card carries when it fell asleep and when its sleep TTL stops it."""
    models = [
        p.ModelInfo(alias="a", backend="kt", served=True, path="/m/a", state="ready"),
        p.ModelInfo(alias="z", backend="kt", served=True, path="/m/z", state="asleep"),
        p.ModelInfo(alias="u", backend="kt", served=True, path="/m/u", state="stopped"),
    ]
    engines = [
        p.EngineInfo(alias="a", state="ready", numa_nodes=[0], cpus=[0, 1, 2], sleep="on"),
        p.EngineInfo(
            alias="z",
            state="asleep",
            numa_nodes=[0, 1],
            sleep="on",
            asleep_since=1000.0,
            sleep_ttl=600.0,
            host_bytes=50,
            reason="put to sleep",
        ),
        p.EngineInfo(alias="u", state="stopped", sleep="unsupported", sleep_ttl=60.0),
    ]
    v = view.build(models, engines, _machine())
    a, z, u = v["models"]
    assert (a["sleep"], a["sleep_expires"], a["host_bytes"]) == ("on", None, None)
    assert z["state"] == "asleep" and z["asleep_since"] == 1000.0 and z["sleep_ttl"] == 600.0
    assert z["sleep_expires"] == 1600.0 and z["host_bytes"] == 50
    assert (u["sleep"], u["sleep_expires"]) == ("unsupported", None)  # not asleep: no countdown
    n0, n1 = v["machine"]["nodes"]
    assert n0["holders"] == ["a"] and n0["asleep"] == [{"alias": "z", "bytes": 25}]
    assert n1["holders"] == [] and n1["asleep"] == [{"alias": "z", "bytes": 25}]
    assert v["machine"]["cpu_owner"] == [[0, "a"], [1, "a"], [2, "a"]]  # none for z
    forever = p.EngineInfo(alias="z", state="asleep", asleep_since=5.0, host_bytes=8)
    assert view.sleep_expires(forever) is None
    assert view.host_shares([forever]) == {}  # no node known: nothing drawn
    assert view.machine(_machine())["nodes"][0]["asleep"] == []  # no status: no sleepers


def test_the_pull_jobs_in_the_daemons_order_with_the_bars_fraction() -> None:
    from ktd.pullwire import PullInfo

    running = PullInfo(
        repo="org/a",
        revision="main",
        names=["a-kt"],
        state="running",
        phase="fetch",
        file="model.safetensors",
        total=400,
        done=100,
        rate=50.0,
        eta=6.0,
        dest="/models/org--a/main",
    )
    planning = PullInfo(repo="org/b", revision="v1", state="running", phase="plan")
    failed = PullInfo(
        repo="org/c", revision="main", state="failed", kind="gated", message="set HF_TOKEN"
    )
    overshot = PullInfo(repo="org/d", revision="main", state="done", total=10, done=12)
    v = view.build([], [], None, pulls=[running, planning, failed, overshot])
    rows = v["pulls"]
    assert [r["key"] for r in rows] == ["org/a@main", "org/b@v1", "org/c@main", "org/d@main"]
    a, b, c, d = rows
    assert (a["file"], a["done"], a["total"], a["rate"], a["eta"]) == (
        "model.safetensors", 100, 400, 50.0, 6.0
    )  # fmt: skip
    assert a["fraction"] == 0.25 and a["names"] == ["a-kt"] and "dest" not in a
    assert b["fraction"] is None  # no total before the plan: no bar to fill
    assert (c["state"], c["kind"], c["message"]) == ("failed", "gated", "set HF_TOKEN")
    assert d["fraction"] == 1.0
    assert view.build([], [], None)["pulls"] == []
