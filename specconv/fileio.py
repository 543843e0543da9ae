"""The file helpers every room shares (standard library and :mod:`specconv.errors` only)."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from .errors import InvalidInputError

__all__ = ["atomic_write", "check_no_dangling_links", "hub_cache_snapshot", "read_json_object"]


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically (temp file + ``os.replace``), with the mode
    a plain ``open`` gives, parents created. Raises OSError (no temp file left behind)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json_object(path: str | os.PathLike[str], *, code: str | None = None,
                     unreadable: str = "{path}: cannot read ({error})",
                     not_object: str = "{path}: not a JSON object") -> dict[str, Any]:
    """The JSON object in ``path`` (strict UTF-8; NaN / Infinity accepted). Raises InvalidInputError
    (``code``) with ``unreadable`` or ``not_object`` (``str.format`` over path and error)."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError, nesting
        raise InvalidInputError(unreadable.format(path=path, error=e), code=code) from e
    if not isinstance(data, dict):
        raise InvalidInputError(not_object.format(path=path, error=None), code=code)
    return data


def hub_cache_snapshot(path: str | os.PathLike[str]) -> tuple[str, str, Path, Path] | None:
    """``(repo id, revision, cache dir, snapshot dir)`` of ``path`` in a huggingface_hub 2.4 cache
    (``file_download.py`` ``repo_folder_name``: ``CACHE/models--ORG--NAME/snapshots/REVISION/``), or None."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(len(parts) - 2, 1, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--") and len(parts[i - 1]) > len("models--"):
            repo = parts[i - 1][len("models--"):].replace("--", "/")
            return repo, parts[i + 1], Path(*parts[:i - 1]), Path(*parts[:i + 2])
    return None


#: the dangling links refused outside a Hub cache: files a reader opens (others stay ignored)
_READ_SUFFIXES = (".json", ".safetensors", ".bin")


def check_no_dangling_links(root: str | os.PathLike[str], what: str = "") -> None:
    """Refuse a directory (``what``: its name in the message) holding links to nothing, hidden entries
    skipped: every link in a Hugging Face cache snapshot (``broken_hub_cache``, hint: the ``hf download``
    line), elsewhere those of :data:`_READ_SUFFIXES` (``dangling_link``); exit 3."""
    root = Path(root)
    links = sorted(p for p in root.rglob("*") if p.is_symlink() and not p.exists()
                   and not any(x.startswith(".") for x in p.relative_to(root).parts))
    snap = hub_cache_snapshot(root)
    if snap is None:
        links = [p for p in links if p.name.endswith(_READ_SUFFIXES)]
    if not links:
        return
    name = f"{what} {root}" if what else str(root)
    shown = "; ".join(f"{p.relative_to(root).as_posix()} -> {os.readlink(p)}" for p in links[:8])
    more = f"; and {len(links) - 8} more" if len(links) > 8 else ""
    if snap is None:
        raise InvalidInputError(f"{name}: {len(links)} link(s) point to nothing: {shown}{more}", code="dangling_link",
                                hint="restore what they point to, or replace each link by its file (`cp -L`)")
    repo, rev, cache, snapshot = snap
    files = [p.relative_to(snapshot).as_posix() for p in links]
    fix = shlex.join(["hf", "download", repo, *files, "--revision", rev, "--cache-dir", str(cache)])
    raise InvalidInputError(
        f"{name}: a broken Hugging Face cache snapshot of {repo} (revision {rev}): {len(links)} file(s) "
        f"link to blobs deleted from the cache: {shown}{more}", code="broken_hub_cache",
        hint=f"download them again: {fix}")
