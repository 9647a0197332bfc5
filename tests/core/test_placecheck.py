"""Never-placeable requests are config errors naming file and field, at serve and reload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ktd.core.config import ConfigError, ConfigFile, ModelEntry, resolve_models
from ktd.core.placecheck import check_spec
from ktd.core.placement import plan
from ktd.core.topology import Topology
from ktd.topology import read_topology
from tests.conftest import ConfigWriter, sim_model
from tests.fixtures.topology import TWO_H100, FakeRun, build, smi_csv, xeon_machine


@pytest.fixture
def xeon(tmp_path: Path) -> Topology:
    return read_topology(build(tmp_path, xeon_machine()), run=FakeRun(smi_csv(TWO_H100)))


def spec(**entry: Any) -> Any:
    import msgspec

    e = msgspec.convert({"path": "/m", "backend": "kt", "alias": "a", **entry}, ModelEntry)
    return resolve_models(ConfigFile(), [e], "config.json", "models.json")["a"]


def test_impossible_plans_are_marked_and_busy_ones_are_not(xeon: Topology) -> None:
    assert plan("a", [7], 0, [], xeon, []).impossible
    assert plan("a", "none", 3, [], xeon, []).impossible
    held = plan("b", [0], 0, [], xeon, [])
    assert held.ok
    from ktd.core.placement import Holding

    busy = plan("a", [0], 0, [], xeon, [Holding("b", (0,), (), in_flight=1)])
    assert not busy.ok and not busy.impossible


@pytest.mark.parametrize(
    ("entry", "path", "words"),
    [
        ({"numa": [7]}, "$[0].numa", "unknown NUMA node 7"),
        ({"gpus": 3}, "$[0].gpus", "machine has 2"),
        ({"gpus": [5]}, "$[0].gpus", "unknown GPU 5"),
        ({"kt": {"extra_args": ["--kt-numa-nodes", "9"]}}, "$[0].kt.extra_args", "node 9"),
        ({"kt": {"tp_size": 4}}, "$[0].kt.tp_size", "needs 4 GPUs"),
    ],
)
def test_check_names_file_and_field(
    xeon: Topology, entry: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check_spec(spec(**entry), xeon)
    assert err.value.file == "models.json" and err.value.path == path
    assert words in err.value.message


def test_possible_but_busy_placements_pass(xeon: Topology) -> None:
    for entry in ({"numa": [0, 1]}, {"gpus": 2}, {"numa": "all", "gpus": [0, 1]}, {}):
        check_spec(spec(**entry), xeon)


def test_without_a_gpu_count_gpu_requests_are_left_to_the_launch(tmp_path: Path) -> None:
    topo = read_topology(build(tmp_path, xeon_machine()), run=FakeRun(exc=FileNotFoundError()))
    assert topo.gpu_error
    check_spec(spec(gpus=4), topo)  # nvidia-smi did not answer: not provably impossible


def test_serve_refuses_and_reload_keeps_running_config(
    write_config: ConfigWriter, daemon_factory: Any
) -> None:
    bad = write_config([sim_model("a-kt", numa=[7])])
    d = daemon_factory(bad, start=False)
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(30) == 2
    out = d.output()
    assert "models.json: $[0].numa:" in out and "unknown NUMA node 7" in out

    good = write_config([sim_model("a-kt")])
    d2 = daemon_factory(good)
    (good.parent / "models.json").write_text(json.dumps([sim_model("a-kt", numa=[7])]))
    res = d2.ktctl("reload")
    assert res.returncode == 1
    assert (
        "$[0].numa" in res.stderr + res.stdout and "unknown NUMA node 7" in res.stderr + res.stdout
    )
    with d2.client() as c:
        assert c.status("a-kt")[0].state == "stopped"
