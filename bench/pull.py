"""A pull's throughput against plain ``huggingface_hub.snapshot_download`` (issue 44,
item 9), and what a resume costs.

Both fetch the same repo (a config and one LFS file of ``--mb`` MiB) from the hub
stand-in (``tests/hub/standin.py``, in this process: the same server for both), each
as a fresh process into a fresh directory, as ktd runs a job: ``snapshot_download``
(``python -c``) against ktd's worker (``python -m ktd.catalog.fetch``: its plan
process, then its fetch with the checksums). The figure is bytes over the wall time
of the process(es), best and median of ``--runs``. The resume: a worker is killed
with SIGKILL once half the file is on disk, the next worker fetches the rest; its
cost is the bytes the stand-in served twice and the resume's time against the time
the rest's bytes take at full speed.

    python bench/pull.py [--mb 256] [--runs 3]

Not run by pytest or CI (``testpaths`` is ``tests``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ktd.catalog import layout  # noqa: E402
from tests.hub.standin import Repo, StandIn  # noqa: E402

MiB = 1 << 20


def env_for(hub: StandIn, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1")
    env["PYTHONPATH"] = str(REPO)
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def hf_run(hub: StandIn, work: Path) -> float:
    dest = work / "hf"
    code = (
        "import huggingface_hub as h; "
        f"h.snapshot_download('org/bench', revision='main', local_dir={str(dest)!r})"
    )
    return timed([sys.executable, "-c", code], env_for(hub, work / "home"))


def ktd_argv(dest: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "ktd.catalog.fetch", "--repo", "org/bench",
            "--revision", "main", "--dest", str(dest), *more]  # fmt: skip


def ktd_run(hub: StandIn, work: Path) -> float:
    dest = work / "ktd"
    env = env_for(hub, work / "home")
    return timed(ktd_argv(dest, "--plan"), env) + timed(ktd_argv(dest), env)


def resume(hub: StandIn, work: Path, size: int) -> tuple[int, float]:
    """(bytes served twice, seconds of the resume) after a kill at half the file."""
    dest = work / "resume"
    env = env_for(hub, work / "home")
    hub.sent.clear()
    hub.stall_after = size // 2
    proc = subprocess.Popen(ktd_argv(dest), env=env, stdout=subprocess.DEVNULL)
    partial = layout.partial_path(dest, hub.repos["org/bench"].sha("model.safetensors"))
    while not (partial.exists() and partial.stat().st_size >= size // 2 - MiB):
        time.sleep(0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    hub.release()
    took = timed(ktd_argv(dest), env)
    return hub.sent["model.safetensors"] - size, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = args.mb * MiB
    hub = StandIn()
    files = {"config.json": b'{"a": 1}\n', "model.safetensors": os.urandom(size)}
    hub.add(Repo("org/bench", files))
    times: dict[str, list[float]] = {"snapshot_download": [], "ktd": []}
    with hub, tempfile.TemporaryDirectory(prefix="ktd-bench-pull-") as tmp:
        for i in range(args.runs):
            for name, fn in (("snapshot_download", hf_run), ("ktd", ktd_run)):
                work = Path(tmp) / f"{name}-{i}"
                work.mkdir()
                times[name].append(fn(hub, work))
                shutil.rmtree(work)
        twice, took = resume(hub, Path(tmp), size)
    rate = {k: size / MiB / min(v) for k, v in times.items()}
    med = {k: size / MiB / statistics.median(v) for k, v in times.items()}
    for name in times:
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:18} best {rate[name]:7.1f} MiB/s  median {med[name]:7.1f} MiB/s  ({runs} s)")
    print(f"ratio ktd/snapshot_download: best {rate['ktd'] / rate['snapshot_download']:.3f}, "
          f"median {med['ktd'] / med['snapshot_download']:.3f}")  # fmt: skip
    half = size / 2 / (rate["ktd"] * MiB)
    print(f"resume after a kill at half: {twice / MiB:.2f} MiB served twice, {took:.2f} s "
          f"(the rest at full speed: {half:.2f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
