"""One engine's log: a file the engine writes itself, followed by ktd, plus an in-memory tail.

The engine's stdout/stderr go straight to ``<log_dir>/<alias>.log`` (O_APPEND),
not through a pipe to ktd: a pipe would break when the daemon restarts, and an
engine whose next ``print`` hits EPIPE may die with a 600 GB model loaded.
ktd follows the file for the tail and the ``log.<alias>`` events, and rotates it
by copy-and-truncate (the engine keeps its fd). When the file cannot be opened
(unwritable directory), the engine falls back to a pipe that ktd drains: the
tail keeps working and the reason is noted.

Everything follows the *file descriptor*, not the path: ktd reads, rotates
(copies to ``.1`` and truncates) and appends its own notes through an fd on
the very file the engine writes to. A log deleted or renamed by hand is still
bounded and still in the tail, and a restarted ktd finds an adopted engine's
file through ``/proc/<pid>/fd/1`` even when no path names it any more.

The engine's API key (``redact``) never reaches the tail, the events or ``ktctl
logs``: SGLang logs its whole ``server_args`` at start, ``api_key`` included. In
the file itself each occurrence is overwritten with as many ``*`` as soon as ktd
reads it (a same-length write in place, through an fd of ktd's own without
O_APPEND: the engine's appends are not disturbed), so backups never hold it.
"""

from __future__ import annotations

import ctypes
import os
import stat
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
        self.count = 0  # lines ever added (``Event.upto``: a follower's seam)
        self.publish = publish
        self.error: str | None = None
        self._partial = b""
        self._rfd: int | None = None
        self._rfd_writable = False
        self._source: int | None = None  # the engine's own file, for the next follow
        self._offset = 0
        self._detached_noted = False
        # The keys to mask (the last few runs'), and the end of the last read, where a
        # key may straddle two reads: (bytes, their offset in the file).
        self._secrets: list[bytes] = []
        self._carry = b""
        self._carry_at = 0
        self._wfd: int | None = None  # the followed file without O_APPEND, for masking

    # ------------------------------------------------------------ the engine's side

    def open_for_engine(self) -> int | None:
        """An fd for the child's stdout+stderr, or None when the file cannot be had.
        ktd keeps a duplicate of it to follow (the same file whatever the path does)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            self._file_error(exc)
            return None
        self.error = None
        self._set_source(os.dup(fd))
        return fd

    def adopt_output(self, pid: int) -> bool:
        """Follow the file an adopted engine's stdout is (``/proc/<pid>/fd/1``), deleted or
        not, and put its last lines in the tail: ``ktctl logs`` right after a daemon restart
        shows what the engine said before."""
        try:
            fd = os.open(f"/proc/{pid}/fd/1", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return False
        if not stat.S_ISREG(st.st_mode):  # a pipe (the fallback) or a tty: nothing to follow
            os.close(fd)
            return False
        self._set_source(fd)
        # Rotation may have just emptied the file: what came before is in the backup,
        # which the file continues byte for byte (a line may straddle the two).
        before = b""
        if self.backups > 0:
            try:
                bfd = os.open(self.path.with_name(f"{self.path.name}.1"), os.O_RDONLY)
            except OSError:
                pass
            else:
                try:
                    before = _read_last(bfd, os.fstat(bfd).st_size)
                finally:
                    os.close(bfd)
        self._backfill(before + _read_last(fd, st.st_size))
        return True

    def redact(self, secret: str | None) -> None:
        """Hide ``secret`` (an engine's API key) from here on: in the tail, the events,
        and the file (``MASK`` bytes in place)."""
        if not secret:
            return
        raw = secret.encode()
        if raw not in self._secrets:
            self._secrets = [*self._secrets, raw][-4:]

    def _scrub(self, data: bytes, at: int) -> None:
        """Mask, in the file, every key in ``data`` (just read at file offset ``at``),
        one that straddles the previous read included. The lines themselves are
        masked as whole strings when added (``_hide``)."""
        if not self._secrets:
            return
        if self._carry and self._carry_at + len(self._carry) == at:
            window, base = self._carry + data, self._carry_at
        else:
            window, base = data, at
        for raw in self._secrets:
            i = window.find(raw)
            while i >= 0:
                self._mask_in_file(base + i, len(raw))
                i = window.find(raw, i + len(raw))
        keep = max(len(raw) for raw in self._secrets) - 1
        self._carry = window[-keep:] if keep else b""
        self._carry_at = base + len(window) - len(self._carry)

    def _masked(self, data: bytes) -> bytes:
        for raw in self._secrets:
            data = data.replace(raw, MASK * len(raw))
        return data

    def _mask_in_file(self, offset: int, length: int) -> None:
        if self._wfd is None:
            if self._rfd is None or not self._rfd_writable:
                return
            try:
                # A new open file description, without O_APPEND: pwrite on an O_APPEND fd
                # appends on Linux, whatever the offset.
                self._wfd = os.open(f"/proc/self/fd/{self._rfd}", os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                return
        try:
            os.pwrite(self._wfd, MASK * length, offset)
        except OSError:
            pass

    def _set_source(self, fd: int) -> None:
        if self._source is not None:
            os.close(self._source)
        self._source = fd

    def _backfill(self, data: bytes) -> None:
        lines = data.split(b"\n")
        if len(data) >= _BACKFILL:
            lines = lines[1:]  # cut mid-line
        if lines and lines[-1] == b"":
            lines.pop()
        self.tail.extend(
            self._hide(ln.decode(errors="replace").rstrip("\r").rsplit("\r", 1)[-1]) for ln in lines
        )
        self.count += len(lines)

    def start_following(self, *, from_end: bool) -> None:
        """Begin reading the file; ``from_end`` skips what an earlier engine wrote."""
        self.stop_following()
        self._detached_noted = False
        if self._source is not None:
            self._rfd, self._source = self._source, None
            self._rfd_writable = True
        else:
            try:
                self._rfd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
                self._rfd_writable = True
            except PermissionError:
                try:
                    self._rfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    self._file_error(exc)
                    return
                self._rfd_writable = False
            except OSError as exc:
                self._file_error(exc)
                return
        self._offset = os.fstat(self._rfd).st_size if from_end else 0
        self._partial = b""
        self._carry = b""

    def stop_following(self) -> None:
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None

    @property
    def watch_path(self) -> Path:
        """What to watch for writes: the followed file itself, whatever its path now is."""
        if self._rfd is not None:
            return Path(f"/proc/self/fd/{self._rfd}")
        return self.path

    def detached(self) -> bool:
        """The path no longer names the file the engine writes (deleted or replaced)."""
        if self._rfd is None:
            return False
        try:
            ours = os.fstat(self._rfd)
            there = os.lstat(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return (ours.st_dev, ours.st_ino) != (there.st_dev, there.st_ino)

    def poll(self) -> list[str]:
        """Read what the engine appended since the last call; rotate when the file is too big."""
        if self._rfd is None:
            return []
        try:
            size = os.fstat(self._rfd).st_size
            if size < self._offset:  # truncated (rotation): start over
                self._offset = 0
                self._carry = b""
            if size == self._offset:
                return []
            data = os.pread(self._rfd, min(size - self._offset, 4 << 20), self._offset)
        except OSError as exc:
            self._file_error(exc)
            self.stop_following()
            return []
        self._scrub(data, self._offset)
        self._offset += len(data)
        lines = self.feed(data)
        if self.max_bytes and self._offset >= self.max_bytes:
            lines += self._rotate()
        return lines

    def _rotate(self) -> list[str]:
        """Move what was read into ``.1`` and drop it from the file, losing no line.

        The engine's O_APPEND fd keeps writing at the end whatever ktd does, so the
        file is cut through ktd's own fd (a log deleted or replaced by hand is bounded
        all the same). Everything the engine wrote is first read into the tail; then
        the head is *collapsed* out of the file (``FALLOC_FL_COLLAPSE_RANGE``: the
        kernel removes it under the inode lock the engine's appends take, so a line
        written meanwhile simply moves down), and the backup gets exactly what was
        removed: backup and file continue each other byte for byte. Where the
        filesystem cannot collapse (tmpfs, a read-only fd), it falls back to logrotate's
        copytruncate, whose lost window is shrunk to the two calls between the last read
        and the truncate. The lines read on the way are returned (as ``poll`` does)."""
        rfd = self._rfd
        if rfd is None:
            return []
        lines: list[str] = []
        if self.detached() and not self._detached_noted:
            self._detached_noted = True
            self._add(
                [
                    f"[ktd] log file {self.path} was removed or replaced; following the "
                    "engine's own file (rotation continues into the backups)"
                ]
            )
        try:
            lines += self._catch_up(rfd)[1]
            for i in range(self.backups - 1, 0, -1):
                src = self.path.with_name(f"{self.path.name}.{i}")
                if src.exists():
                    src.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        except OSError as exc:
            self._file_error(exc)
        cut = _collapsible(rfd, self._offset) if self._rfd_writable else 0
        if cut:
            try:
                if self.backups > 0:
                    self._copy_out(rfd, self.path.with_name(f"{self.path.name}.1"), cut)
            except OSError as exc:
                self._file_error(exc)  # no backup (disk full?): the size bound matters more
            if _collapse(rfd, cut):
                self._offset -= cut
                self._carry_at -= cut
                return lines
        return lines + self._copy_truncate(rfd)

    def _copy_truncate(self, rfd: int) -> list[str]:
        backup = self.path.with_name(f"{self.path.name}.1")
        try:
            if self.backups > 0:
                self._copy_out(rfd, backup, os.fstat(rfd).st_size)
        except OSError as exc:
            self._file_error(exc)
        lines: list[str] = []
        try:
            # What came during the copy: into the tail and the backup.
            late, lines = self._catch_up(rfd)
            if late and self.backups > 0:
                fd = os.open(backup, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.write(fd, self._masked(late))
                finally:
                    os.close(fd)
            if self._rfd_writable:
                os.ftruncate(rfd, 0)
            else:
                os.truncate(self.path, 0)
            self._offset = 0
            self._carry = b""
        except OSError as exc:
            self._file_error(exc)
        return lines

    def _catch_up(self, rfd: int) -> tuple[bytes, list[str]]:
        """Read everything past the offset into the tail: the bytes and the lines."""
        data = b""
        lines: list[str] = []
        while True:
            chunk = os.pread(rfd, 4 << 20, self._offset)
            if not chunk:
                return data, lines
            self._scrub(chunk, self._offset)
            self._offset += len(chunk)
            lines += self.feed(chunk)
            data += chunk

    @staticmethod
    def _copy_out(rfd: int, dest: Path, size: int) -> None:
        """The file's first ``size`` bytes into ``dest`` (replaced)."""
        fd = os.open(
            dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640
        )
        try:
            offset = 0
            while offset < size:
                chunk = os.pread(rfd, min(1 << 20, size - offset), offset)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                offset += len(chunk)
        finally:
            os.close(fd)

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

    def drawing(self) -> str:
        """The line being written now, not ended yet: a progress bar's last frame (tqdm
        redraws with ``\r`` and ends the line only when the bar closes)."""
        frames = [f for f in self._partial.split(b"\r") if f.strip()]
        return frames[-1].decode(errors="replace") if frames else ""

    def note(self, line: str) -> None:
        """A line of ktd's own about this engine (spawn, signals, exit status), in file and tail.
        Written through the followed fd when there is one: into the engine's own file, in
        order with its lines, even when the path is gone."""
        text = f"[ktd] {line}"
        if self.error is None:
            try:
                if self._rfd is not None and self._rfd_writable:
                    os.write(self._rfd, text.encode() + b"\n")
                else:
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

    def _hide(self, line: str) -> str:
        for raw in self._secrets:
            secret = raw.decode()
            if secret in line:
                line = line.replace(secret, "*" * len(secret))
        return line

    def _add(self, lines: list[str]) -> list[str]:
        if self._secrets:
            lines = [self._hide(line) for line in lines]
        if lines:
            self.tail.extend(lines)
            self.count += len(lines)
            if self.publish is not None:
                self.publish(lines)
        return lines

    def last(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return list(self.tail)[-n:]


_BACKFILL = 256 << 10  # what a restarted ktd reads back of a log, at most
MASK = b"*"  # what a key becomes in the log, one per byte


def _read_last(fd: int, size: int) -> bytes:
    start = max(0, size - _BACKFILL)
    try:
        return os.pread(fd, size - start, start)
    except OSError:
        return b""


_FALLOC_FL_COLLAPSE_RANGE = 0x08
_libc: list[ctypes.CDLL | None] = []


def _collapsible(fd: int, read: int) -> int:
    """How much of the file's head may be collapsed: whole blocks of what was read,
    short of the end of the file (the kernel refuses a range that reaches it)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return 0
    block = st.st_blksize or 4096
    cut = min(read, st.st_size - 1) // block * block
    return max(cut, 0)


def _collapse(fd: int, length: int) -> bool:
    """Remove the file's first ``length`` bytes in place; False where unsupported."""
    if not _libc:
        libc: ctypes.CDLL | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        except (OSError, AttributeError):
            libc = None
        _libc.append(libc)
    found = _libc[0]
    if found is None:
        return False
    # Any refusal (EOPNOTSUPP on tmpfs, EINVAL, EIO...) falls back to copytruncate.
    return bool(found.fallocate(fd, _FALLOC_FL_COLLAPSE_RANGE, 0, length) == 0)
