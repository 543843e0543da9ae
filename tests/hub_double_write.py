"""The write half of the loopback Hub double (``tests/hub_double.py``).

Routes and payloads as huggingface_hub 2.4 sends them (``src/huggingface_hub/hf_api.py``
``create_repo`` / ``_validate_yaml`` / ``create_tag`` / ``create_pull_request`` /
``update_repo_settings``, ``_commit_api.py`` ``_fetch_upload_modes`` / ``_send_commit``,
``lfs.py`` ``post_lfs_batch_info`` / ``lfs_upload``):

* ``POST /api/repos/create`` ``{name, organization, visibility?}`` → ``{url}``; 409 + ``{url}`` if it exists;
* ``POST /api/validate-yaml`` ``{content}`` → ``{errors, warnings}`` (400 on bad YAML front matter);
* ``POST /api/models/{r}/preupload/{rev}`` → per file ``uploadMode`` and the remote ``oid``
  (sha256 for LFS, git blob sha1 otherwise) that drives the client's no-op detection;
* ``POST /{r}.git/info/lfs/objects/batch`` → upload/verify actions for objects not yet stored;
  ``PUT /lfs-upload/{oid}`` (sha256 checked) and ``POST /lfs-verify/{oid}``;
* ``POST /api/models/{r}/commit/{rev}[?create_pr=1]`` NDJSON (``header`` with
  ``parentCommit``, ``file`` base64, ``lfsFile``, ``deletedFile``, ``deletedFolder``): 412 when
  ``parentCommit`` is not the head, 422 for an ``lfsFile`` never uploaded, 404 ``EntryNotFound``
  for deleting a missing file;
* ``POST|DELETE /api/models/{r}/branch/{name}``, ``POST /api/models/{r}/tag/{rev}`` (409 if the
  tag exists), ``DELETE /api/models/{r}/tag/{tag}``;
* ``POST /api/models/{r}/discussions`` (pull requests), ``PUT /api/models/{r}/settings``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

from hub_double import _API, Repo, _commit_oid

_R = r"([^/]+/[^/]+)"
_GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


def _url(h) -> str:
    return f"http://{h.headers.get('Host', '127.0.0.1')}"


def _load(h, body: bytes) -> dict | None:
    try:
        return json.loads(body or b"{}")
    except json.JSONDecodeError:
        h._error(400, None, "invalid JSON body")
        return None


def create_repo(h, body: bytes) -> None:
    data = _load(h, body)
    if data is None:
        return
    repo_id = f"{data.get('organization') or 'specconv-test'}/{data.get('name')}"
    if not h._valid_id(repo_id):
        return
    url = f"{_url(h)}/{repo_id}"
    with h.double._lock:
        if repo_id in h.double.repos:
            h._json({"url": url, "error": "You already created this model repo"}, 409)
            return
        oid = _commit_oid(None, {".gitattributes": _GITATTRIBUTES}, "initial commit")
        h.double.repos[repo_id] = Repo(commits={oid: {".gitattributes": _GITATTRIBUTES}}, branches={"main": oid},
                                       private=data.get("visibility") == "private" or bool(data.get("private")))
    h._json({"url": url, "name": repo_id})


def validate_yaml(h, body: bytes) -> None:
    import yaml

    data = _load(h, body)
    if data is None:
        return
    content = data.get("content", "")
    m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
    if not m:
        h._json({"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]})
        return
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        h._json({"errors": [{"message": f"invalid YAML: {e}"}]}, 400)
        return
    if not isinstance(meta, dict):
        h._json({"errors": [{"message": "metadata must be a mapping"}]}, 400)
        return
    h._json({"errors": [], "warnings": []})


def _writable(h, repo_id: str, rev: str) -> tuple[Repo, str] | None:
    repo = h._repo(repo_id)
    if repo is None:
        return None
    sha = h._rev(repo, rev)
    return (repo, sha) if sha else None


def preupload(h, body: bytes, repo_id: str, rev: str) -> None:
    data = _load(h, body)
    found = data is not None and _writable(h, repo_id, rev)
    if not found:
        return
    repo, sha = found
    files = repo.commits[sha]
    out = []
    for f in data.get("files", []):
        sample = base64.b64decode(f.get("sample", ""))
        lfs = repo.is_lfs(f["path"]) or b"\0" in sample or int(f.get("size", 0)) > 10_000_000
        oid = repo.oid(f["path"], files) if f["path"] in files else None
        out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
    h._json({"files": out})


def lfs_batch(h, body: bytes, repo_id: str) -> None:
    data = _load(h, body)
    if data is None or h._repo(repo_id) is None:
        return
    objects = []
    for o in data.get("objects", []):
        entry = {"oid": o["oid"], "size": o["size"]}
        if o["oid"] not in h.double.lfs:
            entry["actions"] = {"upload": {"href": f"{_url(h)}/lfs-upload/{o['oid']}"},
                                "verify": {"href": f"{_url(h)}/lfs-verify/{o['oid']}"}}
        objects.append(entry)
    h._json({"transfer": "basic", "objects": objects})


def lfs_upload(h, body: bytes, oid: str) -> None:
    if hashlib.sha256(body).hexdigest() != oid:
        h._error(400, None, "sha256 mismatch")
        return
    with h.double._lock:
        h.double.lfs[oid] = body
    h._json({})


def lfs_verify(h, body: bytes, oid: str) -> None:
    if oid in h.double.lfs:
        h._json({"success": True})
    else:
        h._error(404, None, "object not found")


def _apply(h, files: dict[str, bytes], lines: list[dict]) -> bool:
    """Apply NDJSON commit lines to ``files`` (in place); False after answering an error."""
    for line in lines[1:]:
        key, v = line.get("key"), line.get("value", {})
        if key == "file":
            files[v["path"]] = base64.b64decode(v["content"])
        elif key == "lfsFile":
            if v["oid"] not in h.double.lfs:
                h._error(422, None, f"LFS object {v['oid']} of {v['path']} was never uploaded")
                return False
            files[v["path"]] = h.double.lfs[v["oid"]]
        elif key == "deletedFile":
            if files.pop(v["path"], None) is None:
                h._error(404, "EntryNotFound", "A file with this name doesn't exist")
                return False
        elif key == "deletedFolder":
            for p in [p for p in files if p.startswith(v["path"].rstrip("/") + "/")]:
                del files[p]
        else:
            h._error(400, None, f"unknown commit line {key!r}")
            return False
    return True


def commit(h, body: bytes, repo_id: str, rev: str) -> None:
    found = _writable(h, repo_id, rev)
    if not found:
        return
    repo, head = found
    lines = [json.loads(x) for x in body.splitlines() if x.strip()]
    if not lines or lines[0].get("key") != "header":
        h._error(400, None, "the first NDJSON line must be the header")
        return
    header = lines[0]["value"]
    create_pr = bool(h._query.get("create_pr"))
    with h.double._lock:
        if h.double.race > 0 and not create_pr:  # another writer commits first: the head moves
            h.double.race -= 1
            moved = {**repo.commits[head], "other-writer.txt": b"committed concurrently\n"}
            head = _commit_oid(head, moved, "concurrent commit")
            repo.commits[head] = moved
            _advance(repo, rev, head, False, {}, "")
        parent = header.get("parentCommit")
        if parent and not create_pr and not head.startswith(parent):
            h._error(412, None, "A commit has happened since. Please refresh and try again.")
            return
        base = repo.resolve(parent) if (parent and create_pr) else head
        files = dict(repo.commits[base])
        if not _apply(h, files, lines):
            return
        for path in h.double.corrupt & set(files):  # a storage fault: the Hub keeps other bytes
            files[path] = files[path] + b"\n"
        oid = _commit_oid(base, files, header.get("summary", ""))
        repo.commits[oid] = files
        pr_url = _advance(repo, rev, oid, create_pr, header, f"{_url(h)}/{repo_id}")
    h._json({"commitOid": oid, "commitUrl": f"{_url(h)}/{repo_id}/commit/{oid}", "pullRequestUrl": pr_url})


def _advance(repo: Repo, rev: str, oid: str, create_pr: bool, header: dict, url: str) -> str | None:
    if create_pr:
        num = len(repo.prs) + 1
        repo.prs.append({"num": num, "title": header.get("summary", ""), "description": header.get("description", ""),
                         "status": "open", "head": oid})
        return f"{url}/discussions/{num}"
    if m := re.fullmatch(r"refs/pr/(\d+)", rev):
        pr = next(p for p in repo.prs if p["num"] == int(m.group(1)))
        pr["head"] = oid
        return f"{url}/discussions/{pr['num']}"
    repo.branches[rev if rev in repo.branches else "main"] = oid
    return None


def branch(h, body: bytes, repo_id: str, name: str) -> None:
    data = _load(h, body)
    repo = data is not None and h._repo(repo_id)
    if not repo:
        return
    with h.double._lock:
        if name in repo.branches:
            h._error(409, None, f"Reference already exists: refs/heads/{name}")
            return
        start = repo.resolve(data.get("startingPoint") or "main")
        if start is None:
            h._error(404, "RevisionNotFound", "Invalid rev id")
            return
        repo.branches[name] = start
    h._json({})


def create_tag(h, body: bytes, repo_id: str, rev: str) -> None:
    data = _load(h, body)
    found = data is not None and _writable(h, repo_id, rev)
    if not found:
        return
    repo, sha = found
    with h.double._lock:
        if data["tag"] in repo.tags:
            h._error(409, None, f"Tag {data['tag']} already exists")
            return
        repo.tags[data["tag"]] = sha
    h._json({})


def delete_tag(h, body: bytes, repo_id: str, tag: str) -> None:
    repo = h._repo(repo_id)
    if repo is None:
        return
    with h.double._lock:
        if repo.tags.pop(tag, None) is None:
            h._error(404, "RevisionNotFound", f"Invalid rev id: {tag}")
            return
    h._json({})


def discussions(h, body: bytes, repo_id: str) -> None:
    data = _load(h, body)
    repo = data is not None and h._repo(repo_id)
    if not repo:
        return
    with h.double._lock:
        num = len(repo.prs) + 1
        repo.prs.append({"num": num, "title": data.get("title", ""), "description": data.get("description", ""),
                         "status": "open" if data.get("pullRequest") else "closed", "head": repo.sha})
    h._json({"num": num, "url": f"{_url(h)}/{repo_id}/discussions/{num}"})


def settings(h, body: bytes, repo_id: str) -> None:
    data = _load(h, body)
    repo = data is not None and h._repo(repo_id)
    if not repo:
        return
    if "visibility" in data or "private" in data:
        repo.private = data.get("visibility") == "private" or data.get("private") is True
    h._json({})


M = _API + "/models/" + _R
WRITE_ROUTES = (
    ("POST", _API + "/repos/create", create_repo),
    ("POST", _API + "/validate-yaml", validate_yaml),
    ("POST", M + r"/preupload/(.+)", preupload),
    ("POST", r"/" + _R + r"\.git/info/lfs/objects/batch", lfs_batch),
    ("PUT", r"/lfs-upload/([0-9a-f]{64})", lfs_upload),
    ("POST", r"/lfs-verify/([0-9a-f]{64})", lfs_verify),
    ("POST", M + r"/commit/(.+)", commit),
    ("POST", M + r"/branch/(.+)", branch),
    ("POST", M + r"/tag/(.+)", create_tag),
    ("DELETE", M + r"/tag/(.+)", delete_tag),
    ("POST", M + r"/discussions", discussions),
    ("PUT", M + r"/settings", settings),
)
