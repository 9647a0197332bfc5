"""The SGLang / kt-kernel probe: parsing and the actionable messages."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ktd.daemon.engine.probe import Prober, ProbeResult, missing_message, parse_probe_output

SHIM = Path(__file__).resolve().parents[3] / "ktd" / "sim" / "shim"


def test_parse() -> None:
    out = (
        'noise\nKTD_PROBE {"version": "3.11", "sglang": "0.5", "kt_kernel": null, '
        '"kt_kernel_error": "ModuleNotFoundError: x"}\n'
    )
    r = parse_probe_output("/py", 0, out)
    assert r.sglang == "0.5" and r.kt_kernel is None and not r.complete
    bad = parse_probe_output("/py", 1, "Segmentation fault\n")
    assert not bad.ok_python and "Segmentation fault" in (bad.error or "")


def test_messages() -> None:
    both = ProbeResult(python="/py", sglang=None, kt_kernel=None)
    msg = missing_message(both, auto_build=True)
    assert msg and "kt_kernel" in msg and "sglang" in msg  # no pip when kt-kernel is missing
    assert (
        missing_message(ProbeResult(python="/py", sglang=None, kt_kernel="1"), auto_build=True)
        is None
    )
    only_sgl = missing_message(
        ProbeResult(python="/py", sglang=None, kt_kernel="1"), auto_build=False
    )
    assert only_sgl and "auto_build" in only_sgl and "pip install sglang" in only_sgl
    assert (
        missing_message(ProbeResult(python="/py", sglang="1", kt_kernel="1"), auto_build=False)
        is None
    )


async def test_probe_caches_success_only(tmp_path: Path) -> None:
    prober = Prober()
    env = dict(os.environ, PYTHONPATH=str(SHIM))
    good = await prober.probe(sys.executable, env)
    assert good.complete and good.sglang
    assert await prober.probe(sys.executable, env) is good
    empty = dict(os.environ, PYTHONPATH=str(tmp_path))
    a = await prober.probe(sys.executable, empty)
    b = await prober.probe(sys.executable, empty)
    assert not a.complete and a is not b
    missing = await prober.probe(str(tmp_path / "nope"), env)
    assert not missing.ok_python and "no such interpreter" in (missing.error or "")
