"""A loopback Hugging Face Hub test double (standard library only) for the read path.

The real ``huggingface_hub`` client and real specconv code run against it over
``http://127.0.0.1:<port>``: start it, point ``HF_ENDPOINT`` at :attr:`HubDouble.url`, set
``HF_HUB_OFFLINE=0`` and ``HF_HUB_DISABLE_XET=1`` (in a subprocess: huggingface_hub reads them
at import). The routes and headers are the ones huggingface_hub 2.4 reads
(``src/huggingface_hub/hf_api.py`` ``repo_info`` / ``list_repo_tree``,
``src/huggingface_hub/file_download.py`` ``get_hf_file_metadata``, ``utils/_http.py``
``hf_raise_for_status``):

* ``GET /api/models/{repo}[/revision/{rev}]`` → ``{id, sha, private, siblings, lastModified}``;
* ``GET /api/models/{repo}/tree/{rev}[/{path}]`` → ``[{type, path, size, oid, lfs?}]``;
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag`` (and
  ``X-Linked-Etag`` / ``X-Linked-Size`` for LFS files), ``Content-Length`` and HTTP
  range requests (``206`` + ``Content-Range``; ``416`` when unsatisfiable);
* ``GET /api/agent-harnesses`` (fetched once by 2.x when it builds a User-Agent);
* errors as the Hub sends them: ``404`` + ``X-Error-Code: RepoNotFound`` /
  ``RevisionNotFound`` / ``EntryNotFound``, ``400`` for an invalid repo id.

Every request is counted (:attr:`HubDouble.requests`, method + path + Range header) with the
body bytes sent (:attr:`HubDouble.bytes_sent`). Run as a script (``python tests/hub_double.py
DIR REPO_ID``) it serves ``DIR`` as ``REPO_ID``, prints its URL and serves until killed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".onnx", ".gguf")
_API = "/" + "api"  # built by concatenation (see hub.md §4.5)


def git_blob_sha1(data: bytes) -> str:
    """The git blob id the Hub reports for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """One model repo at one commit: ``path → bytes``."""

    files: dict[str, bytes]
    sha: str
    private: bool = False

    def is_lfs(self, path: str) -> bool:
        return path.endswith(_LFS_SUFFIXES)

    def oid(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int = 0
    body_bytes: int = 0


@dataclass
class HubDouble:
    """The server: add repos, start, read the counters, stop."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> Repo:
        """Serve ``files`` as ``repo_id`` (one commit, on ``main``)."""
        digest = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items()))
                              .encode()).hexdigest()
        repo = Repo(files=dict(files), sha=digest)
        self.repos[repo_id] = repo
        return repo

    def add_dir(self, repo_id: str, root: Path, prefix: str = "") -> Repo:
        files = {prefix + p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        return self.add_repo(repo_id, files)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(r.body_bytes for r in self.requests)

    def record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def start(self) -> HubDouble:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    double: HubDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    # -- plumbing ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_length: int | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        # counted before the bytes leave, so a client that has read them sees the count
        self._req.status, self._req.body_bytes = status, (len(body) if self.command != "HEAD" else 0)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> None:
        h = {"X-Error-Message": message, **(headers or {})}
        if code:
            h["X-Error-Code"] = code
        self._json({"error": message}, status, h)

    def _repo(self, repo_id: str) -> Repo | None:
        if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
            self._error(400, None, f"Invalid repo id {repo_id!r}")
            return None
        repo = self.double.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _rev(self, repo: Repo, rev: str) -> bool:
        if rev in ("main", repo.sha) or (len(rev) >= 7 and repo.sha.startswith(rev)):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", {"X-Repo-Commit": repo.sha})
        return False

    # -- routes -----------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        self._req = Request(self.command, path, self.headers.get("Range"))
        self.double.record(self._req)  # visible at once; status and bytes filled in by _send
        try:
            if path == _API + "/agent-harnesses":
                self._json({"standardEnvVars": [], "harnesses": {}})
            elif m := re.fullmatch(_API + r"/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
                self._revision(unquote(m.group(1)), unquote(m.group(2) or "main"))
            elif m := re.fullmatch(_API + r"/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
                self._tree(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3) or ""))
            elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                self._resolve(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
            else:
                self._error(404, None, f"no route {self.command} {path}")
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            pass

    def _revision(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev(repo, rev):
            return
        self._json({"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": repo.private,
                    "siblings": [{"rfilename": p} for p in sorted(repo.files)],
                    "lastModified": "2026-01-01T00:00:00.000Z"})

    def _tree(self, repo_id: str, rev: str, sub: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev(repo, rev):
            return
        prefix = sub.rstrip("/") + "/" if sub else ""
        entries, dirs = [], set()
        for p in sorted(repo.files):
            if not p.startswith(prefix):
                continue
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            e = {"type": "file", "path": p, "size": len(repo.files[p]), "oid": git_blob_sha1(repo.files[p])}
            if repo.is_lfs(p):
                e["lfs"] = {"oid": repo.oid(p), "size": len(repo.files[p]), "pointerSize": 134}
            entries.append(e)
        entries += [{"type": "directory", "path": d, "oid": "0" * 40} for d in sorted(dirs) if d.startswith(prefix)]
        self._json(entries)

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev(repo, rev):
            return
        if path not in repo.files:
            self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.sha})
            return
        data = repo.files[path]
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.oid(path)}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if repo.is_lfs(path):
            headers.update({"X-Linked-Etag": f'"{repo.oid(path)}"', "X-Linked-Size": str(len(data))})
        rng = self.headers.get("Range")
        if rng is None or self.command == "HEAD":
            self._send(200, data, headers, content_length=len(data))
            return
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
        if not m or (not m.group(1) and not m.group(2)):
            self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
            return
        if m.group(1):
            start, end = int(m.group(1)), int(m.group(2)) if m.group(2) else len(data) - 1
        else:  # suffix range: the last N bytes
            start, end = max(len(data) - int(m.group(2)), 0), len(data) - 1
        if start >= len(data) or start > end:
            self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
            return
        end = min(end, len(data) - 1)
        self._send(206, data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"})


if __name__ == "__main__":  # pragma: no cover - manual use
    d = HubDouble().start()
    d.add_dir(sys.argv[2], Path(sys.argv[1]))
    print(d.url, flush=True)
    threading.Event().wait()
