"""The daemon's tests: the in-process daemon fixture (``tests/daemon/inprocess.py``)."""

from tests.daemon.inprocess import daemon

__all__ = ["daemon"]
