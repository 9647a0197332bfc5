"""A hub stand-in: the routes ``huggingface_hub`` calls, served from memory, so the real
client runs end to end against ``HF_ENDPOINT=http://127.0.0.1:PORT``.

Routes (as the hub answers them; ``huggingface_hub`` 2.x's ``hf_api.model_info`` and
``file_download.get_hf_file_metadata``/``http_get``):

* ``GET /api/models/{org}/{name}/revision/{rev}[?blobs=true]``: the repo's info, its
  ``sha`` and ``siblings`` (``rfilename``, and with ``blobs``: ``size``, ``blobId``, ``lfs``
  with ``sha256``);
* ``GET /api/models/{org}/{name}/tree/{rev}``: the files (``snapshot_download``'s listing);
* ``HEAD /{org}/{name}/resolve/{rev}/{file}``: a file kept in git answers 200 with its
  ``ETag`` (the git oid) and ``X-Repo-Commit``; an LFS file answers 302 to ``/cdn/…``
  with ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``, as the hub does;
* ``GET`` of either: the bytes, honouring ``Range: bytes=N-``.

Modes, settable while it runs: ``rate`` (bytes a second), ``stall_after`` (bytes of a
file's body after which it stops sending, until ``release()``; with ``stall_once`` only
the first response that gets there), ``fail_status`` (every
route answers it), ``gated`` (401 with ``X-Error-Code: GatedRepo`` without the right
token), a repo it does not have (404 ``RepoNotFound``), ``wrong_sha`` (the metadata names
another sha256). It counts the bytes it sent of each file, to measure what a resume
fetched twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class Repo:
    """One repo's files: ``lfs`` names the ones served as LFS (sha256 in the metadata)."""

    def __init__(self, name: str, files: dict[str, bytes], lfs: set[str] | None = None) -> None:
        self.name = name
        self.files = files
        self.lfs = lfs if lfs is not None else {n for n in files if n.endswith(".safetensors")}

    def sha(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()


class StandIn:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.rate: float = 0.0  # bytes a second, 0: as fast as it goes
        self.stall_after: int | None = None
        self.stall_once = False  # only the first response to reach stall_after stalls
        self.fail_status: int | None = None
        self.gated_token: str | None = None  # set: a request without this token is refused
        self.wrong_sha: set[str] = set()
        self.sent: Counter[str] = Counter()  # body bytes sent, by file name
        self.requests: list[tuple[str, str, str]] = []  # (method, path, range)
        self._release = threading.Event()
        self._lock = threading.Lock()
        standin = self

        class Handler(_Handler):
            hub = standin

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="hub-standin", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.name] = repo
        return repo

    def start(self) -> StandIn:
        self._thread.start()
        return self

    def release(self) -> None:
        """Let every stalled response go on (and no later one stall)."""
        self.stall_after = None
        self._release.set()

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def count(self, name: str, n: int) -> None:
        with self._lock:
            self.sent[name] += n

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: StandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    # ------------------------------------------------------------ answers

    def _error(self, status: int, code: str = "", message: str = "") -> None:
        body = json.dumps({"error": message or code or str(status)}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message or code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refused(self) -> bool:
        hub = self.hub
        if hub.fail_status is not None:
            self._error(hub.fail_status, message="stand-in failure mode")
            return True
        if hub.gated_token is not None:
            auth = self.headers.get("Authorization", "")
            if auth != f"Bearer {hub.gated_token}":
                self._error(401, "GatedRepo", "Access to this model is restricted.")
                return True
        return False

    def _route(self, *, body: bool) -> None:
        hub = self.hub
        path = urlsplit(self.path)
        hub.requests.append((self.command, path.path, self.headers.get("Range", "")))
        if self._refused():
            return
        if m := _TREE.match(path.path):
            self._tree(unquote(m["repo"]))
        elif m := _INFO.match(path.path):
            self._info(unquote(m["repo"]), "blobs" in parse_qs(path.query))
        elif m := _RESOLVE.match(path.path):
            repo = hub.repos.get(m["repo"])
            name = unquote(m["file"])
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            elif name not in repo.files:
                self._error(404, "EntryNotFound", f"{name} not in {repo.name}")
            elif name in repo.lfs and not body:
                self._lfs_head(repo, name)
            else:
                self._bytes(repo, name, body=body)
        elif m := _CDN.match(path.path):
            for repo in hub.repos.values():
                for name in repo.lfs:
                    if repo.sha(name) == m["sha"]:
                        self._bytes(repo, name, body=body)
                        return
            self._error(404, message="no such blob")
        else:
            self._error(404, message="not a stand-in route")

    def _info(self, name: str, blobs: bool) -> None:
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        siblings = []
        for fname, data in repo.files.items():
            entry: dict[str, object] = {"rfilename": fname}
            if blobs:
                entry["size"] = len(data)
                entry["blobId"] = git_oid(data)
                if fname in repo.lfs:
                    sha = repo.sha(fname)
                    if fname in self.hub.wrong_sha:
                        sha = hashlib.sha256(b"not " + data).hexdigest()
                    entry["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
            siblings.append(entry)
        body = json.dumps(
            {"id": name, "modelId": name, "sha": COMMIT, "private": False, "siblings": siblings}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _tree(self, name: str) -> None:
        """``snapshot_download``'s listing (``list_repo_tree``, recursive, one page)."""
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        entries = []
        for fname, data in repo.files.items():
            entry: dict[str, object] = {
                "type": "file",
                "path": fname,
                "size": len(data),
                "oid": git_oid(data),
            }
            if fname in repo.lfs:
                entry["lfs"] = {"oid": repo.sha(fname), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._json(entries)

    def _json(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _lfs_head(self, repo: Repo, name: str) -> None:
        sha = repo.sha(name)
        self.send_response(302)
        self.send_header("Location", f"{self.hub.url}/cdn/{sha}")
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(len(repo.files[name])))
        self.send_header("ETag", f'"{git_oid(repo.files[name])}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _bytes(self, repo: Repo, name: str, *, body: bool) -> None:
        data = repo.files[name]
        start = 0
        rng = self.headers.get("Range", "")
        if m := re.fullmatch(r"bytes=(\d+)-", rng.strip()):
            start = min(int(m[1]), len(data))
        etag = repo.sha(name) if name in repo.lfs else git_oid(data)
        self.send_response(206 if start else 200)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self._send(name, data[start:])

    def _send(self, name: str, data: bytes) -> None:
        hub = self.hub
        chunk = 64 << 10
        sent = 0
        t0 = time.monotonic()
        try:
            while sent < len(data):
                if hub.stall_after is not None and sent >= hub.stall_after:
                    if hub.stall_once:  # this response stalls; the ones after it do not
                        hub.stall_after = None
                    hub._release.wait(timeout=60)
                piece = data[sent : sent + chunk]
                self.wfile.write(piece)
                sent += len(piece)
                hub.count(name, len(piece))
                if hub.rate:
                    ahead = sent / hub.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            return
