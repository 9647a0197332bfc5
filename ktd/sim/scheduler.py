"""The sim's scheduler child: ``python -m ktd.sim.scheduler`` (started by ``ktd.sim.procs``).

Why a real child process: ktd must find and kill an engine's whole process
tree, and SGLang's model lives in scheduler children. Like SGLang's scheduler
this child

* sets ``PR_SET_PDEATHSIG=SIGKILL`` first, so it dies with the server process;
* does the model "load" (``Load weight begin/end`` lines, ``KTD_SIM_LOAD_TIME``)
  and reports ``ready`` to the parent on a pipe, so the server binds its port
  only after the load, as SGLang does;
* on a load failure prints a traceback and exits, and the parent gives up
  (``KTD_SIM_CRASH_DURING_LOAD``);
* then idles in ``signal.pause()``: no CPU at all.

With ``KTD_SIM_ESCAPE=1`` it first forks a grandchild that calls ``setsid()``
and sleeps forever: a descendant that a process-group kill does not reach.

Stdlib only, and a tiny import graph: this process must start fast and cheap.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from types import FrameType

from ktd.sim.knobs import Knobs
from ktd.sim.logfmt import line_buffered, log

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
TP = " TP0"


def _prctl(option: int, arg: int | bytes) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_pdeathsig() -> bool:
    """SIGKILL us when the parent (thread) dies: SGLang's ``kill_itself_when_parent_died``."""
    return _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def set_name(name: str) -> None:
    """``/proc/<pid>/comm``: lets ``ps``/``top`` tell the sim's processes apart."""
    _prctl(PR_SET_NAME, name.encode()[:15])


#: The line the child writes on its pipe when a SIGTERM reaches it (then it dies of it).
SIGTERM_LINE = b'{"signal": "SIGTERM"}\n'


def _report_sigterm(ready_fd: int) -> None:
    """Say so on the pipe when a SIGTERM comes, then die of it as before (-15).

    Why: a SIGTERM to the whole group is a crash to SGLang (the server sees its scheduler
    die), and the server decides so at once, from the signal pending in this process or
    its exit status. Between the two there was a window (the signal taken, the process
    not yet gone: its teardown, or a handler of the interpreter's, such as coverage's
    saving its data) in which the server took it for its own SIGTERM alone. A line
    written first thing in the handler closes it. A handler installed before this one
    (coverage's) still runs, and re-raises the signal itself.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            os.write(ready_fd, SIGTERM_LINE)
        except OSError:
            pass
        if callable(previous):
            previous(signum, frame)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


def _idle_forever() -> None:
    while True:
        signal.pause()


def _escape(ready_fd: int) -> int:
    """Fork a grandchild that leaves the session and sleeps forever; returns its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the grandchild
        try:
            os.setsid()
            os.close(ready_fd)  # so the parent's death watch on the pipe still works
            set_name("sglang::escaped")
            _idle_forever()
        finally:
            os._exit(0)
    return pid


def _load_weights(seconds: float, crash: bool) -> None:
    """The "model load": sleeps, or fails half-way with an exception."""
    if crash:
        time.sleep(seconds / 2)
        raise RuntimeError(
            "CUDA out of memory while loading weights "
            "(simulated failure: KTD_SIM_CRASH_DURING_LOAD=1)"
        )
    # SGLang's bar (``sglang.srt.utils.common.BAR_FORMAT``), drawn as tqdm draws it on
    # stderr: each frame after a carriage return, the line ended when the bar closes.
    shards = 4
    for done in range(shards + 1):
        pct = 100 * done // shards
        sys.stderr.write(
            f"\rLoading safetensors checkpoint shards: {pct:3d}% Completed | "
            f"{done}/{shards} [00:00<00:00, 1.00it/s]"
        )
        sys.stderr.flush()
        if done < shards:
            time.sleep(seconds / shards)
    sys.stderr.write("\n")
    sys.stderr.flush()


class OutOfMemoryError(RuntimeError):
    """torch's (``torch.OutOfMemoryError``, as a traceback names it)."""


OutOfMemoryError.__module__ = "torch"


def _torch_oom(count: int, most: int) -> RuntimeError:
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of "
        "23.55 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process "
        f"has 22.52 GiB memory in use. (simulated: --kt-num-gpu-experts {count} > "
        f"KTD_SIM_GPU_EXPERTS_MAX={most})"
    )


def _gpu_experts(count: int | None, most: int | None) -> None:
    """``--kt-num-gpu-experts`` above what the "GPU" holds: the weight load dies with
    torch's CUDA out-of-memory message (PyTorch 2.x's CUDACachingAllocator words), which
    SGLang's scheduler prints in "Scheduler hit an exception: <traceback>". (Built
    elsewhere: the traceback quotes this line, and torch's own never names the error.)"""
    if count is None or most is None or count <= most:
        return
    raise _torch_oom(count, most)


def _init_model_runner(args: argparse.Namespace, knobs: Knobs) -> dict[str, object]:
    log("Init torch distributed begin.", TP)
    log("Init torch distributed ends. mem usage=0.00 GB", TP)
    log("Load weight begin. avail mem=0.00 GB", TP)
    _load_weights(knobs.load_time, knobs.crash_during_load)
    _gpu_experts(args.kt_num_gpu_experts, knobs.gpu_experts_max)
    log(
        "Load weight end. type=SimForCausalLM, dtype=torch.bfloat16, "
        "avail mem=0.00 GB, mem usage=0.00 GB.",
        TP,
    )
    ctx = int(args.context_length)
    max_total = max(ctx * 4, 65536)
    log(f"KV Cache is allocated. #tokens: {max_total}, K size: 0.00 GB, V size: 0.00 GB", TP)
    log(
        f"max_total_num_tokens={max_total}, chunked_prefill_size=8192, "
        f"max_prefill_tokens=16384, max_running_requests=4096, context_len={ctx}, "
        "available_gpu_mem=0.00 GB",
        TP,
    )
    return {"max_total_num_tokens": max_total, "max_req_input_len": ctx - 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ktd.sim.scheduler")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--ready-fd", type=int, required=True)
    p.add_argument("--context-length", type=int, required=True)
    p.add_argument("--kt-num-gpu-experts", type=int, default=None)
    args = p.parse_args(argv)

    pdeathsig = set_pdeathsig()
    if os.getppid() != args.parent_pid:
        return 0  # the server died before PDEATHSIG was armed: nothing to serve
    set_name("sglang::schedul")
    line_buffered()
    # A stray SIGUSR1 (the server's hang toggle) sent to the group must not kill us.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    knobs, _ = Knobs.from_env()
    if knobs.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        _report_sigterm(args.ready_fd)
    if not pdeathsig:
        log("sim: could not set PR_SET_PDEATHSIG; this child may outlive its parent", TP)

    escaped: int | None = None
    if knobs.escape:
        escaped = _escape(args.ready_fd)
        log(f"sim: escaped grandchild pid {escaped} (new session)", TP)

    try:
        info = _init_model_runner(args, knobs)
    except Exception:
        log(f"Scheduler hit an exception: {traceback.format_exc()}", TP)
        return 1

    info.update({"status": "ready", "pid": os.getpid(), "escaped_pid": escaped})
    # The write end stays open until this process dies: EOF is the parent's death notice.
    os.write(args.ready_fd, json.dumps(info).encode() + b"\n")
    _idle_forever()
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
