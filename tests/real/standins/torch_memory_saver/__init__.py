"""Test-only stand-in for torch_memory_saver, on the real SGLang engine's PYTHONPATH only.

The real package pauses CUDA allocations (``cuMemUnmap``) and needs libcuda: on this
tier's CPU it cannot load, and SGLang started with ``--enable-memory-saver`` dies at
start. This stand-in keeps the package's Python surface (``torch_memory_saver``,
``region``, ``pause``, ``resume``, ``cuda_graph``, ``disable``, ``configure_subprocess``)
and its state machine, as ``csrc/core.cpp`` 0.0.9 has it: a pause of a tag whose
regions are not all active, or a resume of one not paused, ends the process with
exit(1) and the same message. It frees nothing (there is no GPU memory here), so what
the real tier proves with it is SGLang's own side of a sleep: its routes, its
scheduler's assertions, its door, the order of calls ktd makes; the memory itself is
proven on a GPU box (``ktctl sleep --verify``).
"""

import contextlib
import sys

__all__ = ["configure_subprocess", "torch_memory_saver"]

ACTIVE, PAUSED = "active", "paused"


class _Saver:
    def __init__(self):
        self.hook_mode = "preload"
        self.tags = {}  # tag -> state of its regions (all alike: one state per tag)
        self._disabled = 0

    @property
    def enabled(self):
        return True

    @contextlib.contextmanager
    def region(self, tag="default", enable_cpu_backup=False):
        self.tags.setdefault(tag, ACTIVE)
        yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph=None, pool=None, stream=None, tag="cuda_graph", **kwargs):
        self.tags.setdefault(tag, ACTIVE)
        yield

    @contextlib.contextmanager
    def disable(self):
        self._disabled += 1
        try:
            yield
        finally:
            self._disabled -= 1

    def pause(self, tag=None):
        for name in self._named(tag):
            if self.tags[name] != ACTIVE:
                self._die("Cannot pause allocation that is not active.", name, "pause")
            self.tags[name] = PAUSED

    def resume(self, tag=None):
        for name in self._named(tag):
            if self.tags[name] != PAUSED:
                self._die("Cannot resume allocation that is not paused. ", name, "resume")
            self.tags[name] = ACTIVE

    def _named(self, tag):
        return [t for t in self.tags if not tag or t == tag]

    @staticmethod
    def _die(message, tag, func):
        print(
            f"[torch_memory_saver.cpp] {message} tag={tag} file=csrc/core.cpp func={func}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)


torch_memory_saver = _Saver()


@contextlib.contextmanager
def configure_subprocess():
    """The real one sets LD_PRELOAD for the scheduler; nothing to preload here."""
    yield
