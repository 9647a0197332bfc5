"""The ``machine`` request: the picture the dashboard draws, from a fixture machine and a
real daemon that places engines on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktd import protocol as p
from ktd.daemon.pool.machine import machine_reply
from ktd.topology import read_topology
from tests.fixtures.topology import TWO_H100, build_xeon, smi_run
from tests.frontend.ui.uienv import box_models

GIB = 1 << 30


def test_machine_reply_in_bytes_with_holders_and_history(tmp_path: Path) -> None:
    topo = read_topology(build_xeon(tmp_path), run=smi_run(TWO_H100))
    holder = p.Holder(alias="a", state="ready", numa_nodes=[1], cpus=[8, 9], gpus=[0])
    reply = machine_reply(topo, [holder], {"a": [60.0, 58.5]}, reserved_cpus=[0])
    assert reply.cpu_model.startswith("Intel(R) Xeon(R)")
    assert [n.id for n in reply.nodes] == [0, 1]
    node1 = reply.nodes[1]
    assert node1.mem_total == 256 * GIB and node1.mem_free == 240 * GIB
    assert node1.mem_available >= node1.mem_free and len(node1.cpus) == 16
    assert [(g.index, g.memory_total) for g in reply.gpus] == [(0, 81559 << 20), (1, 81559 << 20)]
    assert reply.gpus[0].memory_used == 4 << 20 and reply.gpu_error is None
    assert reply.holders == [holder] and reply.reserved_cpus == [0]
    assert reply.load_history == {"a": [60.0, 58.5]}
    # It crosses the wire as any reply does.
    assert p.decode_reply(p.encode(reply)) == reply


def test_the_daemon_answers_with_what_it_places_on(
    tmp_path: Path, ktd_env: dict[str, str], write_config: Any, daemon_factory: Any
) -> None:
    from tests.frontend.ui.uienv import machine_env

    env = machine_env(tmp_path, ktd_env)
    daemon = daemon_factory(write_config(box_models(tmp_path / "models")), env=env)
    with daemon.client() as c:
        before = c.machine()
        assert [n.id for n in before.nodes] == [0, 1] and len(before.gpus) == 2
        assert before.holders == []
        c.load("alpha")
        after = c.machine()
    [held] = after.holders
    assert (held.alias, held.state, held.numa_nodes, held.gpus) == ("alpha", "ready", [0], [0])
    assert held.cpus == [0]
    assert len(after.load_history["alpha"]) == 1
    daemon.ktctl("evict", "--all")
