"""A loopback Hugging Face Hub test double (standard library only): read and write paths.

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

The write half (create repo, validate-yaml, preupload, LFS batch/upload/verify, the NDJSON
commit with its ``parentCommit`` guard, branches, tags, pull requests, settings) lives in
``tests/hub_double_write.py``; write requests must carry :attr:`HubDouble.token` when it is
set (401 otherwise) and :meth:`HubDouble.fault` injects 5xx/429/401/403 answers.

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
from urllib.parse import parse_qs, unquote, urlsplit

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".onnx", ".gguf")
_API = "/" + "api"  # built by concatenation (see hub.md §4.5)


def git_blob_sha1(data: bytes) -> str:
    """The git blob id the Hub reports for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """One model repo: commits (``oid → {path: bytes}``) and refs (branches, tags, PRs).

    ``files`` / ``sha`` are the head of ``main`` (what the read-path tests serve).
    """

    commits: dict[str, dict[str, bytes]]
    branches: dict[str, str]
    private: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    prs: list[dict] = field(default_factory=list)  # {num, title, description, status, head}

    @property
    def sha(self) -> str:
        return self.branches["main"]

    @property
    def files(self) -> dict[str, bytes]:
        return self.commits[self.sha]

    def is_lfs(self, path: str) -> bool:
        return path.endswith(_LFS_SUFFIXES)

    def oid(self, path: str, files: dict[str, bytes] | None = None) -> str:
        data = (self.files if files is None else files)[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)

    def resolve(self, rev: str) -> str | None:
        """A branch, tag, ``refs/pr/N`` or a (>= 7 hex) commit prefix → commit oid."""
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if m := re.fullmatch(r"refs/pr/(\d+)", rev):
            n = int(m.group(1))
            return next((pr["head"] for pr in self.prs if pr["num"] == n), None)
        if len(rev) >= 7:
            return next((c for c in self.commits if c.startswith(rev)), None)
        return None


def _commit_oid(parent: str | None, files: dict[str, bytes], message: str) -> str:
    listing = sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items())
    return hashlib.sha1(json.dumps([parent, listing, message]).encode()).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int = 0
    body_bytes: int = 0
    request_bytes: int = 0

    @property
    def is_write(self) -> bool:
        """A request that changes state on the real Hub (``validate-yaml`` and the LFS batch
        negotiation are no writes; a preupload is a read-only check too)."""
        if self.method in ("GET", "HEAD"):
            return False
        return not (self.path.endswith(("/validate-yaml", "/info/lfs/objects/batch")) or "/preupload/" in self.path)


@dataclass
class HubDouble:
    """The server: add repos, start, read the counters, stop."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    #: the one token write requests (and private repos) must carry as ``Bearer``; None = any
    token: str | None = None
    #: uploaded LFS objects, sha256 → bytes (shared by all repos, like the Hub's storage)
    lfs: dict[str, bytes] = field(default_factory=dict)
    #: injected faults: [method, path regex, status, remaining count (-1 = forever)]
    faults: list[list] = field(default_factory=list)
    #: paths whose committed bytes the double alters (a corrupted remote, for verification tests)
    corrupt: set[str] = field(default_factory=set)
    #: the next ``race`` commits are preceded by another writer's commit on the same branch
    race: int = 0
    #: set by :meth:`stop`: requests hanging on a status-0 fault return
    released: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.RLock)
    _server: ThreadingHTTPServer | None = None

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> Repo:
        """Serve ``files`` as ``repo_id`` (one commit, on ``main``)."""
        digest = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items()))
                              .encode()).hexdigest()
        repo = Repo(commits={digest: dict(files)}, branches={"main": digest})
        self.repos[repo_id] = repo
        return repo

    def add_dir(self, repo_id: str, root: Path, prefix: str = "") -> Repo:
        files = {prefix + p.relative_to(root).as_posix(): p.read_bytes()
                 for p in sorted(root.rglob("*")) if p.is_file()}
        return self.add_repo(repo_id, files)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(r.body_bytes for r in self.requests)

    @property
    def writes(self) -> list[Request]:
        """Requests that would change state on the real Hub."""
        with self._lock:
            return [r for r in self.requests if r.is_write]

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return sum(r.request_bytes for r in self.requests)

    def fault(self, method: str, path_regex: str, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests matching ``method`` + ``path_regex`` (re.search)
        with ``status`` (``count=-1``: every one, forever; ``status=0``: hang without answering)."""
        with self._lock:
            self.faults.append([method, path_regex, status, count])

    def take_fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for f in self.faults:
                if f[0] == method and re.search(f[1], path) and f[3] != 0:
                    f[3] -= 1 if f[3] > 0 else 0
                    return int(f[2])
        return None

    def record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def start(self) -> HubDouble:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
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

    def _valid_id(self, repo_id: str) -> bool:
        if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id or len(repo_id) > 96 \
                or repo_id.endswith(".git") or any(part.endswith(("-", ".")) for part in repo_id.split("/")):
            self._error(400, None, f"Invalid repo id {repo_id!r}")
            return False
        return True

    def _repo(self, repo_id: str) -> Repo | None:
        if not self._valid_id(repo_id):
            return None
        repo = self.double.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _rev(self, repo: Repo, rev: str) -> str | None:
        sha = repo.resolve(rev)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", {"X-Repo-Commit": repo.sha})
        return sha

    def _authorized(self) -> bool:
        want = self.double.token
        return want is None or self.headers.get("Authorization") == f"Bearer {want}"

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(n) if n else b""
        self._req.request_bytes = len(data)
        return data

    # -- routes -----------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        path, self._query = split.path, parse_qs(split.query)
        self._req = Request(self.command, path, self.headers.get("Range"))
        self.double.record(self._req)  # visible at once; status and bytes filled in by _send
        try:
            body = self._body()
            if (fault := self.double.take_fault(self.command, path)) == 0:  # hang: a client killed mid-request
                self.double.released.wait(30)
                self.close_connection = True
            elif fault is not None:
                self._error(fault, None, f"injected fault {fault}", {"Retry-After": "0"} if fault == 429 else None)
            elif self.command in ("POST", "PUT", "DELETE") and not path.startswith(("/lfs-upload/", "/lfs-verify/")) \
                    and not self._authorized():  # LFS hrefs are pre-signed storage URLs, as on the Hub
                self._error(401, None, "Invalid credentials in Authorization header")
            elif self.command in ("GET", "HEAD"):
                self._read_route(path)
            else:
                self._write_route(path, body)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            pass

    def _read_route(self, path: str) -> None:
        a = _API
        if path == a + "/agent-harnesses":
            self._json({"standardEnvVars": [], "harnesses": {}})
        elif path == a + "/whoami-v2":
            self._whoami()
        elif m := re.fullmatch(a + r"/models/([^/]+/[^/]+)/refs", path):
            self._refs(unquote(m.group(1)))
        elif m := re.fullmatch(a + r"/models/([^/]+/[^/]+)/discussions(?:/(\d+))?", path):
            self._discussions(unquote(m.group(1)), m.group(2))
        elif m := re.fullmatch(a + r"/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
            self._revision(unquote(m.group(1)), unquote(m.group(2) or "main"))
        elif m := re.fullmatch(a + r"/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
            self._tree(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3) or ""))
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            self._resolve(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)))
        else:
            self._error(404, None, f"no route {self.command} {path}")

    def _write_route(self, path: str, body: bytes) -> None:
        from hub_double_write import WRITE_ROUTES  # noqa: PLC0415 - the write half lives next door

        for method, pattern, fn in WRITE_ROUTES:
            if method == self.command and (m := re.fullmatch(pattern, path)):
                fn(self, body, *[unquote(g) if g is not None else None for g in m.groups()])
                return
        self._error(404, None, f"no route {self.command} {path}")

    def _whoami(self) -> None:
        if self.double.token is not None and not self._authorized():
            self._error(401, None, "Invalid credentials in Authorization header")
            return
        self._json({"name": "specconv-test", "type": "user", "orgs": [],
                    "auth": {"accessToken": {"role": "write"}}})

    def _refs(self, repo_id: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return

        def ref(name: str, kind: str, sha: str) -> dict:
            return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}

        prs = [{"name": str(p["num"]), "ref": f"refs/pr/{p['num']}", "targetCommit": p["head"]} for p in repo.prs]
        self._json({"branches": [ref(b, "heads", s) for b, s in sorted(repo.branches.items())],
                    "tags": [ref(t, "tags", s) for t, s in sorted(repo.tags.items())], "converts": [],
                    "pullRequests": prs if self._query.get("include_prs") else []})

    def _discussion(self, repo_id: str, pr: dict) -> dict:
        return {"num": pr["num"], "title": pr["title"], "status": pr["status"], "isPullRequest": True,
                "createdAt": "2026-01-01T00:00:00.000Z", "author": {"name": "specconv-test"},
                "repo": {"name": repo_id, "type": "model"}, "events": [], "filesWithConflicts": [],
                "changes": {"base": "refs/heads/main"}, "description": pr["description"]}

    def _discussions(self, repo_id: str, num: str | None) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        if num is not None:
            pr = next((p for p in repo.prs if p["num"] == int(num)), None)
            if pr is None:
                self._error(404, None, "Discussion not found")
            else:
                self._json(self._discussion(repo_id, pr))
            return
        status = (self._query.get("status") or [None])[0]
        found = [self._discussion(repo_id, p) for p in repo.prs if status in (None, "all", p["status"])]
        if int((self._query.get("p") or ["0"])[0]) > 0:
            found = []
        self._json({"count": len(found), "start": 0, "discussions": found})

    def _revision(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        sha = repo and self._rev(repo, rev)
        if not sha:
            return
        self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                    "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])],
                    "lastModified": "2026-01-01T00:00:00.000Z"})

    def _tree(self, repo_id: str, rev: str, sub: str) -> None:
        repo = self._repo(repo_id)
        sha = repo and self._rev(repo, rev)
        if not sha:
            return
        files = repo.commits[sha]
        prefix = sub.rstrip("/") + "/" if sub else ""
        entries, dirs = [], set()
        for p in sorted(files):
            if not p.startswith(prefix):
                continue
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            e = {"type": "file", "path": p, "size": len(files[p]), "oid": git_blob_sha1(files[p])}
            if repo.is_lfs(p):
                e["lfs"] = {"oid": repo.oid(p, files), "size": len(files[p]), "pointerSize": 134}
            entries.append(e)
        entries += [{"type": "directory", "path": d, "oid": "0" * 40} for d in sorted(dirs) if d.startswith(prefix)]
        self._json(entries)

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo(repo_id)
        sha = repo and self._rev(repo, rev)
        if not sha:
            return
        files = repo.commits[sha]
        if path not in files:
            self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
            return
        data = files[path]
        oid = repo.oid(path, files)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{oid}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if repo.is_lfs(path):
            headers.update({"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data))})
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
