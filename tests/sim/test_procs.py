"""The sim's scheduler child and the server's view of it (``ktd.sim.procs.Scheduler``).

A SIGTERM to the whole group is a crash to SGLang; the server decides so from the child
at once: its exit status, a SIGTERM still pending in it, or the line it writes on its
pipe on taking one. The line closes the window in which the signal was taken but the
child not yet gone (its teardown, or a slower handler before it, such as coverage's
saving its data): the server then took the group's SIGTERM for its own alone
(``tests/sim/test_lifecycle.py::test_group_sigterm_is_a_crash_to_sglang`` failed so
under coverage on a loaded box).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from ktd.sim.procs import Scheduler
from ktd.sim.scheduler import SIGTERM_LINE

pytestmark = pytest.mark.e2e  # real child processes


@pytest.fixture
def quick_load(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KTD_SIM_LOAD_TIME", "0.01")
    yield


async def test_the_child_says_it_took_a_sigterm_then_dies_of_it(quick_load: None) -> None:
    sched = Scheduler(context_length=512)
    try:
        ready = await sched.wait_ready()
        assert ready is not None and ready["status"] == "ready"
        assert not sched.got_sigterm()
        os.kill(sched.pid, signal.SIGTERM)
        with trio.fail_after(10):
            code = await sched.wait_exit()
        assert code == -signal.SIGTERM  # as the default action: SGLang's exit status
        assert SIGTERM_LINE in sched._buf  # said first, on the pipe
        assert sched.got_sigterm()
    finally:
        sched.popen.kill()
        sched.popen.wait()


async def test_a_child_that_took_a_sigterm_and_is_still_alive_counts_as_signalled() -> None:
    """The window itself: the line is on the pipe, the child not gone, nothing pending."""
    read_fd, write_fd = os.pipe()
    code = (
        "import os, sys, time\n"
        f'os.write({write_fd}, b\'{{"status": "ready"}}\\n\' + {SIGTERM_LINE!r})\n'
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], pass_fds=(write_fd,))  # noqa: ASYNC220
    os.close(write_fd)
    sched = Scheduler.__new__(Scheduler)  # the server's side only, on this pipe
    sched.popen, sched.pid, sched._read_fd, sched._pipe, sched._buf = (
        child,
        child.pid,
        read_fd,
        None,
        b"",
    )
    try:
        ready = await sched.wait_ready()
        assert ready == {"status": "ready"}
        with trio.fail_after(10):
            while not sched.got_sigterm():  # the line may still be on its way
                await trio.sleep(0.01)
        assert child.poll() is None  # alive, and no SIGTERM pending in it
    finally:
        child.kill()
        child.wait()
