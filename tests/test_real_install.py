"""tests/real/install.py makes everything the real-SGLang tier opens (issue: the tiny model
was never made on a fresh machine, so CI failed everywhere but where it had been made by
hand). No real install here: an empty cache, and a cache whose venv is faked complete."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parent / "real" / "install.py"


def run_install(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KTD_REAL_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, str(INSTALL), *args], env=env, capture_output=True, text=True, timeout=60
    )


def paths(cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """(upstream dir, kt dir, model dir) as install.py names them for this cache."""
    monkeypatch.setenv("KTD_REAL_CACHE", str(cache))
    from tests.real import engine_env

    inst = engine_env._install_module()
    return Path(inst.upstream_dir()), Path(inst.kt_dir()), Path(inst.model_dir())


def fake_venv(d: Path, python_script: str) -> None:
    """A venv install.py takes as complete: its marker and an executable ``venv/bin/python``."""
    py = d / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(python_script)
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    (d / ".ktd-real-complete").write_text("{}")


def test_check_on_an_empty_cache_lists_every_artefact_missing(tmp_path: Path) -> None:
    r = run_install(tmp_path, "--kt", "--check")
    assert r.returncode == 1, r
    missing = [line for line in r.stdout.splitlines() if line.startswith("MISSING")]
    assert [m.split(":")[0].split(None, 1)[1] for m in missing] == [
        "upstream sglang venv",
        "tiny model",
        "sglang-kt venv",
    ]
    assert not any(tmp_path.iterdir()), "a --check must install nothing"


def test_install_makes_the_model_when_the_venv_is_cached_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact fresh-machine failure: venv complete, model never made. The fake python
    plays make_model.py (`python make_model.py OUTDIR`) by writing the model's marker."""
    upstream, _, model = paths(tmp_path, monkeypatch)
    fake_venv(upstream, '#!/bin/sh\nmkdir -p "$2" && touch "$2/.ktd-tiny-model-complete"\n')
    assert run_install(tmp_path, "--check").returncode == 1
    r = run_install(tmp_path)
    assert r.returncode == 0, r.stderr
    assert (model / ".ktd-tiny-model-complete").exists()
    assert r.stdout.splitlines()[-1] == str(upstream / "venv" / "bin" / "python")
    assert run_install(tmp_path, "--check").returncode == 0
    again = run_install(tmp_path)  # idempotent: nothing is made twice
    assert again.returncode == 0 and "making the tiny model" not in again.stderr


def test_an_install_that_cannot_make_the_model_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, _, _ = paths(tmp_path, monkeypatch)
    fake_venv(upstream, "#!/bin/sh\nexit 0\n")  # "succeeds" but writes nothing
    r = run_install(tmp_path)
    assert r.returncode != 0
    assert "tiny model" in r.stderr


def test_the_tier_opens_only_what_install_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine_env (what the tier's fixtures call) resolves to install.py's artefacts, and
    refuses with the install command while any is missing."""
    upstream, kt, model = paths(tmp_path, monkeypatch)
    from tests.real import engine_env

    with pytest.raises(engine_env.EngineNotInstalled, match=r"tiny model.*install\.py"):
        engine_env.model_dir(install=False)
    fake_venv(upstream, "#!/bin/sh\n")
    fake_venv(kt, "#!/bin/sh\n")
    with pytest.raises(engine_env.EngineNotInstalled, match="tiny model"):
        engine_env.venv_python(kt=True, install=False)
    model.mkdir()
    (model / ".ktd-tiny-model-complete").write_text("{}")
    assert run_install(tmp_path, "--kt", "--check").returncode == 0
    assert engine_env.model_dir(install=False) == str(model)
    assert engine_env.venv_python(kt=True, install=False) == str(kt / "venv" / "bin" / "python")
