"""``ktctl catalog`` against a real daemon on the AMX box (fixture sysfs tree and fake
nvidia-smi through ``$KTD_SYSFS_ROOT``/``$KTD_NVIDIA_SMI``): the catalog with the tests' own
file and a broken one, which variant fits and why, what is on disk, one entry's flags.
One daemon for the module; no test changes it."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ktctl.cli import main
from ktd.catalog.ondisk import revision_dir
from ktd.catalog.verify import Checked, Marker, write_marker
from tests.catalog.machines import AMX_GPUS, amx_machine, tree
from tests.conftest import MARK, DaemonProc, own_env

REPO = Path(__file__).resolve().parents[2]
TINY = Path(__file__).with_name("tiny.json")
COMMIT = "c" * 40


class Box:
    def __init__(self, root: Path, daemon: DaemonProc) -> None:
        self.root = root
        self.daemon = daemon
        self.bad = root / "etc" / "bad.json"
        self.models = root / "models"


@pytest.fixture(scope="module")
def box(shared_marker: str) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="ktd-cat-", dir="/tmp"))
    etc = root / "etc"
    etc.mkdir()
    (etc / "bad.json").write_text(
        json.dumps({"catalog": 1, "models": [{"name": "x", "famly": "y"}]})
    )
    (etc / "models.json").write_text("[]")
    cfg = {
        "models_file": "models.json",
        "daemon": {"stop_grace": 5, "drain_timeout": 5},
        "catalog": {"files": [str(TINY), "bad.json"], "dir": str(root / "models")},
    }
    (etc / "config.json").write_text(json.dumps(cfg))
    done = revision_dir(root / "models", "deepseek-ai/DeepSeek-V4-Flash", COMMIT)
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    write_marker(  # as a finished pull leaves it
        done,
        Marker(
            repo="deepseek-ai/DeepSeek-V4-Flash",
            revision=COMMIT,
            commit=COMMIT,
            files=(Checked(name="config.json", size=2),),
        ),
    )
    fs, smi = tree(root / "machine", amx_machine(), AMX_GPUS)
    env = own_env()
    env.update(
        {
            MARK: shared_marker,
            "KTD_RUNTIME_DIR": str(root / "run"),
            "KTD_STATE_DIR": str(root / "state"),
            "KTD_SYSFS_ROOT": str(fs),
            "KTD_NVIDIA_SMI": str(smi),
            "PYTHONPATH": str(REPO),
        }
    )
    daemon = DaemonProc(config=etc / "config.json", env=env, log_path=root / "ktd.log").start()
    try:
        yield Box(root, daemon)
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


def ktctl(capsys: pytest.CaptureFixture[str], box: Box, *argv: str) -> tuple[int, str, str]:
    code = main(["--socket", str(box.daemon.socket), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_catalog_on_this_box(box: Box, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ktctl(capsys, box, "catalog")
    assert code == 0, err
    assert "this box: Intel(R) Xeon(R) Platinum 8480+: amx" in out
    assert "GPU 0: NVIDIA L20, 52 GB" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].islower()}
    assert (
        "mxfp4 (MXFP4)" in rows["deepseek-v4-flash"] and "model (0 GB)" in rows["deepseek-v4-flash"]
    )
    assert "amxint4 (AMXINT4)" in rows["kimi-k2-thinking"]
    assert "fp8 (FP8)" in rows["deepseek-v3.2"]
    assert "sglang" in rows["tiny-qwen2"]  # the tests' own catalog file
    # The broken file is named with its field; the rest loaded.
    assert f"{box.bad}: $.models[0]: Object contains unknown field `famly`" in out


def test_one_entry_with_its_variants_and_flags(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = ktctl(capsys, box, "catalog", "kimi-k2-thinking-kt")
    assert code == 0, err
    assert "variant: amxint4 (AMXINT4): the first variant this box can run" in out
    assert "  * amxint4 (AMXINT4, weights: kt-weights)" in out
    assert "  + rawint4 (RAWINT4, weights: model)" in out
    assert "kt-weights: KVCache-ai/Kimi-K2-Thinking-CPU-weight @ main (no pinned commit" in out
    assert "--kt-method AMXINT4" in out and "--tool-call-parser kimi_k2" in out
    assert "--kt-num-gpu-experts:" in out and "16 GB per GPU" in out


def test_json_has_the_origins_and_whats_on_disk(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = ktctl(capsys, box, "catalog", "deepseek-v4-kt", "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    [model] = doc["models"]
    flags = {f["flag"]: f for f in model["flags"]["flags"]}
    assert (
        flags["--kt-method"]["values"] == ["MXFP4"] and flags["--kt-method"]["origin"] == "derived"
    )
    assert flags["--attention-backend"]["origin"] == "catalog"
    assert flags["--kt-threadpool-count"]["values"] == ["2"]
    assert int(flags["--kt-num-gpu-experts"]["values"][0]) > 0
    [pulled] = model["on_disk"]
    assert pulled["commit"] == COMMIT and pulled["complete"] and pulled["role"] == "model"
    assert doc["dir"] == str(box.models)


def test_an_unknown_name_is_unknown_model(box: Box, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = ktctl(capsys, box, "catalog", "no-such-model")
    assert code == 4
    assert "no catalog entry is called 'no-such-model'" in err and "deepseek-v4-flash" in err
