"""A pull's worker: ``python -m ktd.catalog.fetch --repo ORG/NAME --revision REV --dest DIR``.

One process per running job, started and killed by the daemon (``ktd.catalog.pulls``):
killable at any byte, no thread in the daemon, nothing kept alive by accident. It speaks
JSON lines on stdout, one object each (``ev``: ``plan``, ``file``, ``bytes``, ``verify``,
``error``, ``done``), and fetches through ``huggingface_hub``: the repo's metadata
(``HfApi.model_info(files_metadata=True)``: files, sizes, LFS sha256), each file's HEAD
(``get_hf_file_metadata``: ETag, commit, size, Xet data) and its bytes (``http_get`` with
``resume_size``: a Range request from the partial file's end), or ``hf_hub_download`` where
the hub serves the file through Xet. ``HF_ENDPOINT`` and ``HF_TOKEN`` come from the
environment, as for any huggingface_hub program.

Resume across a kill: the partial file is ``.ktd/partial/<etag>.incomplete`` (kept, never a
per-process name), so the next worker asks for the bytes from its end. The lock is an
``flock`` the kernel drops with the process: never stale after a kill -9.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec

from ktd.catalog import layout, plan, verify

#: Exit codes: the daemon reads the kind from the last ``error`` line; these only say
#: done, a plan printed, an error said, or a worker that died without saying.
EXIT_DONE = 0
EXIT_ERROR = 3

#: Seconds between two ``bytes`` lines of one file (the first and last always go).
TICK = 0.1

#: The piece ``http_get`` reads before it writes (huggingface_hub's default is 10 MiB:
#: a kill loses what was read and not written, and a slow link shows no byte for as long
#: as one piece takes, which the stall detector would take for a stall).
CHUNK = 1 << 20


class Failed(Exception):
    """A pull's error of a kind the daemon acts on (``ktd.core.pulljob.KINDS``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Out:
    """The JSON lines to the daemon."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def emit(self, ev: str, **fields: Any) -> None:
        self._stream.write(msgspec.json.encode({"ev": ev, **fields}) + b"\n")
        self._stream.flush()


class Counting:
    """The partial file as ``http_get`` writes it, counting bytes for the progress lines
    and hashing them as they pass (an LFS file's sha256 then costs no second read of a
    file that may be tens of GB)."""

    def __init__(
        self, f: IO[bytes], name: str, done: int, total: int, out: Out, sha: Any = None
    ) -> None:
        self._f, self._name, self.done, self._total, self._out = f, name, done, total, out
        self.sha = sha
        self._last = 0.0

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        if self.sha is not None:
            self.sha.update(data[:n])
        self.done += n
        now = time.monotonic()
        if now - self._last >= TICK or self.done >= self._total:
            self._last = now
            self._out.emit("bytes", file=self._name, done=self.done, total=self._total)
        return n

    def seek(self, *args: int) -> int:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        """``http_get``'s rewind when a server ignored the Range: the hash starts over
        from what is left."""
        n = self._f.truncate(size)
        self.done = self._f.tell()
        if self.sha is not None:
            self._f.flush()
            self.sha = prefix_sha(Path(str(self._f.name)), self.done)
        return n

    def flush(self) -> None:
        self._f.flush()


def prefix_sha(path: Path, size: int) -> Any:
    """A sha256 fed with the first ``size`` bytes of ``path`` (a resumed partial file)."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        left = size
        while left > 0 and (chunk := f.read(min(left, CHUNK))):
            sha.update(chunk)
            left -= len(chunk)
    return sha


def die_with(parent: int) -> bool:
    """Ask the kernel for SIGKILL when the daemon that started this worker dies (Linux's
    ``PR_SET_PDEATHSIG``): an orphan would hold the lock the next daemon's worker wants.
    False when the daemon is gone already."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def take_lock(dest: Path) -> int:
    """The pull's lock on ``dest``: one worker fills a directory at a time."""
    path = layout.lock_path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Failed("busy", f"another pull is filling {dest}") from None
    return fd


def read_meta(repo: str, revision: str, patterns: Sequence[str]) -> plan.HubMeta:
    from huggingface_hub import HfApi
    from huggingface_hub.utils._paths import filter_repo_objects

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    siblings = list(info.siblings or [])
    wanted = filter_repo_objects(
        siblings, allow_patterns=list(patterns) or None, key=lambda s: s.rfilename
    )
    files = []
    for s in wanted:
        layout_name = Path(s.rfilename)
        if layout_name.is_absolute() or ".." in layout_name.parts:
            raise Failed("bad_source", f"the hub named a file {s.rfilename!r} outside the repo")
        lfs = s.lfs
        size = s.size if s.size is not None else (lfs.size if lfs is not None else 0)
        files.append(
            plan.HubFile(
                name=s.rfilename,
                size=int(size),
                sha256=lfs.sha256 if lfs is not None else None,
                blob_id=s.blob_id,
            )
        )
    if not files:
        raise Failed("missing", f"{repo}@{revision} has no file matching {list(patterns)}")
    return plan.HubMeta(
        repo=repo, revision=revision, commit=info.sha or revision, files=tuple(files)
    )


def fetch_file(meta: plan.HubMeta, f: plan.HubFile, dest: Path, out: Out) -> str | None:
    """One file into place: resumed from its partial file by Range, moved when whole;
    its sha256 as it was written (LFS files over HTTP), else None."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._headers import build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available

    constants.DOWNLOAD_CHUNK_SIZE = CHUNK
    url = hf_hub_url(meta.repo, f.name, revision=meta.commit)
    head = get_hf_file_metadata(url, retry_on_errors=True)
    size = head.size if head.size is not None else f.size
    target = dest / f.name
    if head.xet_file_data is not None and is_xet_available() and not constants.HF_HUB_DISABLE_XET:
        # Xet: content-addressed chunks with a cache of their own (a resume is the cache's).
        from huggingface_hub import hf_hub_download

        out.emit("file", file=f.name, size=size, have=0, xet=True)
        hf_hub_download(meta.repo, f.name, revision=meta.commit, local_dir=dest)
        out.emit("bytes", file=f.name, done=size, total=size)
        return None
    partial = layout.partial_path(dest, head.etag or f.etag)
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if have > size:
        partial.unlink()
        have = 0
    out.emit("file", file=f.name, size=size, have=have)
    sha = (prefix_sha(partial, have) if have else hashlib.sha256()) if f.sha256 else None
    with partial.open("ab") as raw:
        counting = Counting(raw, f.name, have, size, out, sha)
        if have < size:
            http_get(
                head.location,
                counting,  # type: ignore[arg-type]  # a file as http_get uses one
                resume_size=have,
                headers=build_hf_headers(),
                expected_size=size,
            )
        # No fsync: a killed worker's bytes are in the page cache for the next one, and
        # forcing each file to disk cost 40% of a pull's throughput (bench/pull.py); a
        # power cut's damage is what the checksums and a re-pull are for.
        raw.flush()
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, target)
    return None if counting.sha is None else str(counting.sha.hexdigest())


def check_all(meta: plan.HubMeta, dest: Path, out: Out, hashed: dict[str, str]) -> list[str]:
    """Every file's checksum against the metadata; the marker written with the outcome.
    ``hashed``: the sums taken while downloading. A file the last marker found good, of
    the same size and sum, is not read again (a re-pull of a 600 GB model checks it
    in a second, not in minutes)."""
    problems: list[str] = []
    checked: list[verify.Checked] = []
    before = verify.read_marker(dest)
    flagged = verify.bad_files(dest)
    good = {c.name: c for c in before.files} if before is not None else {}
    for f in meta.files:
        out.emit("verify", file=f.name)
        known = good.get(f.name)
        if f.name not in hashed and f.name not in flagged and known is not None:
            try:
                same = (dest / f.name).stat().st_size == known.size == f.size
            except OSError:
                same = False
            if same and known.sha256 == f.sha256:
                checked.append(known)
                continue
        problem = verify.check_file(dest / f.name, f, hashed.get(f.name))
        if problem is not None:
            problems.append(problem)
        checked.append(verify.Checked(name=f.name, size=f.size, sha256=f.sha256))
    verify.write_marker(
        dest,
        verify.Marker(
            repo=meta.repo,
            revision=meta.revision,
            commit=meta.commit,
            files=tuple(checked),
            problems=tuple(problems),
        ),
    )
    return problems


def classify(exc: BaseException) -> Failed:
    """huggingface_hub's errors, and the disk's, as the kinds the daemon tells apart."""
    from huggingface_hub import errors as hf

    if isinstance(exc, Failed):
        return exc
    if isinstance(exc, layout.BadSource):
        return Failed("bad_source", str(exc))
    if isinstance(exc, hf.GatedRepoError):
        return Failed(
            "gated", f"gated repo: ask for access on the hub, then set HF_TOKEN ({_first(exc)})"
        )
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        if status in (401, 403):
            return Failed(
                "gated", f"refused ({status}): set HF_TOKEN to a token with access ({_first(exc)})"
            )
        if (
            isinstance(
                exc, (hf.RepositoryNotFoundError, hf.RevisionNotFoundError, hf.EntryNotFoundError)
            )
            or status == 404
        ):
            return Failed("missing", f"not on the hub (404): {_first(exc)}")
        return Failed("server", f"the hub answered {status}: {_first(exc)}")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Failed("disk", f"the disk is full ({exc.strerror}); what was fetched is kept")
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return Failed("network", _first(exc))
    import httpx2

    if isinstance(exc, httpx2.HTTPError):
        return Failed("network", f"{type(exc).__name__}: {_first(exc)}")
    if isinstance(exc, OSError):
        return Failed("io", f"{type(exc).__name__}: {exc}")
    return Failed("internal", f"{type(exc).__name__}: {exc}")


def _first(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def run(
    args: argparse.Namespace,
    out: Out,
    fit: Callable[[plan.PullPlan], list[str]] = plan.no_fit_check,
) -> int:
    dest = Path(args.dest)
    layout.check_source(args.repo, args.revision)
    if args.plan:  # reads only: no lock (a dry run beside a running pull), no file
        meta = read_meta(args.repo, args.revision, args.pattern)
        have = plan.scan(meta, dest, verify.bad_files(dest))
        out.emit("plan", plan=plan.make_plan(meta, dest, have, plan.free_bytes(dest)))
        return EXIT_DONE
    dest.mkdir(parents=True, exist_ok=True)
    lock = take_lock(dest)
    try:
        meta = read_meta(args.repo, args.revision, args.pattern)
        layout.meta_path(dest).write_bytes(msgspec.json.encode(meta))
        have = plan.scan(meta, dest, verify.bad_files(dest))
        the_plan = plan.make_plan(meta, dest, have, plan.free_bytes(dest))
        out.emit("plan", plan=the_plan)
        if the_plan.problems and not args.force:
            raise Failed("disk", "; ".join(the_plan.problems))
        hashed: dict[str, str] = {}
        for f, pf in zip(meta.files, the_plan.files, strict=True):
            if pf.present == f.size and (dest / f.name).exists():
                continue
            sha = fetch_file(meta, f, dest, out)
            if sha is not None:
                hashed[f.name] = sha
        problems = check_all(meta, dest, out, hashed)
        if problems:
            raise Failed("checksum", "; ".join(problems))
        out.emit("done", commit=meta.commit, bytes=the_plan.total)
        return EXIT_DONE
    finally:
        os.close(lock)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ktd.catalog.fetch")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--pattern", action="append", default=[])
    parser.add_argument("--plan", action="store_true", help="print the plan and stop")
    parser.add_argument("--force", action="store_true", help="fetch even if the disk looks short")
    parser.add_argument("--parent", type=int, default=0, help="die with this process (the daemon)")
    args = parser.parse_args(argv)
    if args.parent and not die_with(args.parent):
        return EXIT_ERROR
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    out = Out(sys.stdout.buffer)
    try:
        return run(args, out)
    except BaseException as exc:  # every end of a worker is said on its last line
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        failed = classify(exc)
        out.emit("error", kind=failed.kind, message=failed.message)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
