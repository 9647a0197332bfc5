"""One engine's log: a file the engine writes itself, followed by ktd, plus an in-memory tail.

The engine's stdout/stderr go straight to ``<log_dir>/<alias>.log`` (O_APPEND),
not through a pipe to ktd: a pipe would break when the daemon restarts, and an
engine whose next ``print`` hits EPIPE may die with a 600 GB model loaded.
ktd follows the file for the tail and the ``log.<alias>`` events, and rotates it
by copy-and-truncate (the engine keeps its fd). When the file cannot be opened
(unwritable directory), the engine falls back to a pipe that ktd drains: the
tail keeps working and the reason is noted.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Callable
from pathlib import Path


class EngineLog:
    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = 64 << 20,
        backups: int = 3,
        tail: int = 2000,
        publish: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.tail: deque[str] = deque(maxlen=tail)
        self.publish = publish
        self.error: str | None = None
        self._partial = b""
        self._rfd: int | None = None
        self._offset = 0

    # ------------------------------------------------------------ the engine's side

    def open_for_engine(self) -> int | None:
        """An fd for the child's stdout+stderr, or None when the file cannot be had."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            self._file_error(exc)
            return None
        self.error = None
        return fd

    def start_following(self, *, from_end: bool) -> None:
        """Begin reading the file; ``from_end`` skips what an earlier engine wrote."""
        self.stop_following()
        try:
            self._rfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._file_error(exc)
            return
        self._offset = os.fstat(self._rfd).st_size if from_end else 0
        self._partial = b""

    def stop_following(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None

    def poll(self) -> list[str]:
        """Read what the engine appended since the last call; rotate when the file is too big."""
        if self._rfd is None:
            return []
        try:
            size = os.fstat(self._rfd).st_size
            if size < self._offset:  # truncated (rotation): start over
                self._offset = 0
            if size == self._offset:
                return []
            data = os.pread(self._rfd, min(size - self._offset, 4 << 20), self._offset)
        except OSError as exc:
            self._file_error(exc)
            self.stop_following()
            return []
        self._offset += len(data)
        lines = self.feed(data)
        if self.max_bytes and self._offset >= self.max_bytes:
            self._rotate()
        return lines

    def _rotate(self) -> None:
        """copytruncate: the engine's O_APPEND fd keeps writing at the new end."""
        try:
            for i in range(self.backups - 1, 0, -1):
                src = self.path.with_name(f"{self.path.name}.{i}")
                if src.exists():
                    src.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
            if self.backups > 0:
                shutil.copyfile(self.path, self.path.with_name(f"{self.path.name}.1"))
            os.truncate(self.path, 0)
            self._offset = 0
        except OSError as exc:
            self._file_error(exc)

    def _file_error(self, exc: OSError) -> None:
        msg = f"log file {self.path}: {exc.strerror or exc}"
        if msg != self.error:
            self.error = msg
            self._add([f"[ktd] {msg}; keeping only the in-memory tail"])

    # ------------------------------------------------------------ lines

    def feed(self, data: bytes) -> list[str]:
        """Split raw engine output into lines for the tail (also used for the pipe fallback)."""
        chunk = self._partial + data
        *complete, self._partial = chunk.split(b"\n")
        if len(self._partial) > 65536:  # a runaway line without newline
            complete.append(self._partial)
            self._partial = b""
        # tqdm redraws with \r: keep the last frame of each line.
        lines = [c.decode(errors="replace").rstrip("\r").rsplit("\r", 1)[-1] for c in complete]
        return self._add(lines)

    def note(self, line: str) -> None:
        """A line of ktd's own about this engine (spawn, signals, exit status), in file and tail."""
        text = f"[ktd] {line}"
        if self.error is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640
                )
                try:
                    os.write(fd, text.encode() + b"\n")
                finally:
                    os.close(fd)
            except OSError as exc:
                self._file_error(exc)
            else:
                if self._rfd is not None:
                    # Read it back, in order with the engine's own lines.
                    self.poll()
                    return
        self._add([text])

    def _add(self, lines: list[str]) -> list[str]:
        if lines:
            self.tail.extend(lines)
            if self.publish is not None:
                self.publish(lines)
        return lines

    def last(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return list(self.tail)[-n:]
