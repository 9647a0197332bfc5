"""A command on a real pseudo-terminal: its controlling terminal, stdin, stdout and stderr
are the pty's slave side (stdin may be a file instead), as in a user's shell (issue 43:
ktctl's prompts were never tried on a terminal, and none of them worked on one).

``PtyProc`` starts the command in a session of its own with the pty as its controlling
terminal (so ``/dev/tty`` opens), reads what it writes (``expect``), answers
(``send``) and waits for its exit. Everything the command wrote is kept in ``output``
as the bytes the terminal got (with the line discipline's ``\\r\\n``).
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence


def _controlling_tty() -> None:  # pragma: no cover - runs in the child before exec
    """Make fd 1 (the pty's slave) the new session's controlling terminal."""
    fcntl.ioctl(1, termios.TIOCSCTTY, 0)


class PtyProc:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        cols: int = 120,
        rows: int = 40,
        stdin: int | None = None,
    ) -> None:
        """``stdin``: a file descriptor to read instead of the terminal (``apply -`` reads
        the file there and asks on the terminal all the same)."""
        master, slave = os.openpty()
        import struct

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.master = master
        self.output = b""
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=slave if stdin is None else stdin,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_controlling_tty,
        )
        os.close(slave)  # the child holds it now: its exit ends our reads (EIO)

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")

    def _read(self, timeout: float) -> bool:
        """Read what is there within ``timeout``; False at the end (the child closed it)."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every slave fd is closed
            return False
        if not data:
            return False
        self.output += data
        return True

    def expect(self, needle: str, timeout: float = 30.0) -> str:
        """Read until ``needle`` has been written (from the start); the output so far."""
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)):
                if needle in self.text:
                    break
                raise AssertionError(f"{needle!r} never came on the terminal; got {self.text!r}")
        return self.text

    def send(self, text: str) -> None:
        """Type ``text`` (a line ends with ``\\n``, as the Enter key gives it)."""
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 60.0) -> int:
        """Read to the end (the child and all it started closed the terminal), then the
        exit status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._read(0.2):
            pass
        return self.proc.wait(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)

    def __enter__(self) -> PtyProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
