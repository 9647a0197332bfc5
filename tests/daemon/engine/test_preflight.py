"""A load that cannot start never costs a running model (issue 13), through real daemons.

The costly case first: a ready engine holds the only GPU; loading another model
would evict it. When that model cannot start (missing path, missing kt_kernel,
does not fit), the load is refused before anything is stopped and the ready
engine still serves. The tests share one daemon (``tests/stack.py``) on a fixture Xeon
with one fake GPU; each tries a model of its own, made once for the module.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, SHIM, engine_auth, sim_model
from tests.fixtures.topology import build_xeon, smi_script
from tests.stack import Stack, StackFactory

GIB = 1 << 30
ONE_GPU = [(0, "NVIDIA H100 80GB HBM3", 81559, 559)]  # 80 GiB free


def fake_machine(tmp_path: Path) -> dict[str, str]:
    """The daemon reads a fixture Xeon (2 nodes, 440 GiB free) and one fake H100."""
    root = build_xeon(tmp_path / "machine")
    smi = smi_script(tmp_path / "nvidia-smi", ONE_GPU)
    return {"KTD_SYSFS_ROOT": str(root), "KTD_NVIDIA_SMI": str(smi)}


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` apparent bytes that takes no disk: hundreds of GB of weights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


def safetensors(path: Path, tensors: dict[str, int]) -> Path:
    """A safetensors shard whose header lists ``name -> bytes`` (data left sparse)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, size in tensors.items():
        span = [offset, offset + size]
        shape = [size // 2] if name.endswith((".bias", "norm.weight")) else [2, size // 4]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": span}
        offset += size
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return path


def gpu_model(alias: str, **kw: Any) -> dict[str, Any]:
    entry = sim_model(alias, **kw)
    entry["gpus"] = [0]
    return entry


def serves(d: Any, alias: str) -> bool:
    [e] = d.client().status(alias)
    if e.state != "ready" or not e.url:
        return False
    r = httpx.post(
        f"{e.url}/v1/chat/completions",
        json={"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=10,
        headers=engine_auth(e.port),
    )
    return r.status_code == 200


def bad_models(root: Path) -> list[dict[str, Any]]:
    """The model each test tries, made once: what cannot start, and what can."""
    typo = gpu_model("typo-kt")
    typo["path"] = str(root / "no-such-model")
    empty = root / "empty-model"
    empty.mkdir()
    nocfg = gpu_model("nocfg-kt", kt={"kt_weight_path": str(root / "gone-kt")})
    nocfg["path"] = str(empty)
    only_sglang = root / "shim-no-kt"
    only_sglang.mkdir()
    (only_sglang / "sglang").symlink_to(SHIM / "sglang")
    nokt = gpu_model("nokt-kt", env={"PYTHONPATH": os.pathsep.join((str(only_sglang), str(REPO)))})
    huge = root / "huge-kt"
    sparse(huge / "experts-0.bin", 300 * GIB)
    sparse(huge / "experts-1.bin", 200 * GIB)  # 500 GiB > 440 GiB free on the Xeon
    dense = root / "big-dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    safetensors(
        dense / "model-00001.safetensors",
        {
            "model.embed_tokens.weight": 70 * GIB,
            "model.layers.0.self_attn.q_proj.weight": 20 * GIB,
            # Routed experts live in host RAM under kt: not counted on the GPU.
            "model.layers.1.mlp.experts.0.up_proj.weight": 500 * GIB,
        },
    )
    dense_kt = gpu_model("dense-kt")
    dense_kt["path"] = str(dense)
    big = root / "big-kt"
    sparse(big / "experts.bin", 400 * GIB)  # fits in 440 GiB
    ignored = root / "ignored-kt"
    sparse(ignored / "experts.bin", 600 * GIB)
    ignore = gpu_model("ignore-kt", kt={"kt_weight_path": str(ignored)})
    ignore["fit"] = "ignore"
    flag = gpu_model("flag-kt", kt={"extra_args": ["--no-such-flag", "1"]})
    flag["path"] = str(root / "missing-too")
    return [
        typo,
        nocfg,
        nokt,
        gpu_model("huge-kt", kt={"kt_weight_path": str(huge)}),
        dense_kt,
        gpu_model("big-kt", kt={"kt_weight_path": str(big)}),
        ignore,
        flag,
    ]


@pytest.fixture(scope="module")
def shared(stack_factory: StackFactory, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    root = tmp_path_factory.mktemp("preflight")
    models = [gpu_model("good-kt"), *bad_models(root), gpu_model("other-kt")]
    return stack_factory(models, with_frontend=False, env=fake_machine(root))


@pytest.fixture
def stack(shared: Stack) -> Stack:
    return shared.reset()


def setup(stack: Stack) -> tuple[Any, int]:
    """The module's daemon with ``good-kt`` ready on the only GPU."""
    d = stack.daemon
    r = d.ktctl("load", "good-kt")
    assert r.returncode == 0, r.stderr + d.output()
    [good] = d.client().status("good-kt")
    return d, good.pid


def assert_refused_and_untouched(d: Any, alias: str, pid: int, *words: str) -> str:
    r = d.ktctl("load", alias)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "load_failed" in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    [good] = d.client().status("good-kt")
    assert good.state == "ready" and good.pid == pid, d.output()
    assert serves(d, "good-kt")
    [bad] = d.client().status(alias)
    assert bad.state == "failed"
    return r.stderr


def test_missing_model_path_refused_and_ready_engine_still_serves(stack: Stack) -> None:
    d, pid = setup(stack)
    err = assert_refused_and_untouched(d, "typo-kt", pid, "does not exist", "no-such-model")
    assert "no engine was stopped" in err
    # The refusal came before placement: nothing was ever spawned for it.
    [bad_info] = d.client().status("typo-kt")
    assert bad_info.pid is None


def test_missing_config_json_and_weights_refused(stack: Stack) -> None:
    d, pid = setup(stack)
    assert_refused_and_untouched(d, "nocfg-kt", pid, "no config.json", "gone-kt")


def test_missing_kt_kernel_refused_and_ready_engine_still_serves(stack: Stack) -> None:
    d, pid = setup(stack)
    assert_refused_and_untouched(d, "nokt-kt", pid, "kt_kernel is not importable")


def test_does_not_fit_refused_with_numbers_and_ready_engine_still_serves(stack: Stack) -> None:
    d, pid = setup(stack)
    err = assert_refused_and_untouched(
        d, "huge-kt", pid, "does not fit", "500.0 GiB", "440.0 GiB", "after evicting good-kt"
    )
    assert '"fit": "ignore"' in err
    # The estimate shows the same numbers without loading anything.
    r = d.ktctl("load", "--estimate", "huge-kt")
    assert r.returncode == 0, r.stderr
    assert "500.0 GiB" in r.stdout and "DOES NOT FIT" in r.stdout
    doc = json.loads(d.ktctl("load", "--estimate", "huge-kt", "--json").stdout)
    assert doc["estimate"]["host_bytes"] == 500 * GIB and doc["fit"]["ok"] is False
    plan = json.loads(d.ktctl("load", "--dry-run", "huge-kt", "--json").stdout)["plan"]
    assert plan["evict"] == ["good-kt"] and plan["fit"]["ok"] is False


def test_gpu_does_not_fit_counts_non_expert_weights(stack: Stack) -> None:
    d, pid = setup(stack)
    assert_refused_and_untouched(d, "dense-kt", pid, "GPU 0 needs 90.0 GiB")


def test_fitting_load_evicts_and_names_the_victim(stack: Stack) -> None:
    """The other side: a model that can start does evict, and says whom."""
    d, _ = setup(stack)
    with d.client() as c, c.subscribe(["engine."]) as sub:
        r = d.ktctl("load", "big-kt")
        assert r.returncode == 0, r.stderr + d.output()
        # On a pipe (no progress line) the one line printed says whom it stopped.
        assert r.stdout.strip().endswith("; stopped good-kt to make room"), r.stdout
        seen = []
        while (ev := sub.get(timeout=0.5)) is not None:
            seen.append(ev)
    phases = [ev.phase for ev in seen if ev.alias == "big-kt" and ev.phase]
    assert "stopping good-kt to make room" in phases
    reasons = {ev.reason for ev in seen if ev.alias == "good-kt" and ev.state == "stopped"}
    assert reasons == {"evicted to make room for big-kt"}
    [good] = d.client().status("good-kt")
    assert good.state == "stopped" and good.reason == "evicted to make room for big-kt"
    # --json: the same as a field; a load that stopped nobody says so with an empty list.
    again = json.loads(d.ktctl("load", "big-kt", "--json").stdout)["engine"]
    assert again["made_room"] == ["good-kt"]
    r = d.ktctl("load", "good-kt", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["engine"]["made_room"] == ["big-kt"]


def test_fit_ignore_loads_anyway(stack: Stack) -> None:
    d = stack.daemon  # 600 GiB of weights on a Xeon with 440 GiB free, "fit": "ignore"
    r = d.ktctl("load", "ignore-kt")
    assert r.returncode == 0, r.stderr + d.output()


def test_flag_sglang_rejects_refused_with_path_problems_in_one_message(stack: Stack) -> None:
    d, pid = setup(stack)
    err = assert_refused_and_untouched(d, "flag-kt", pid, "--no-such-flag", "missing-too")
    assert err.count("preflight:") == 1
