"""The file helpers every room shares: an atomic file write, reading a JSON object and the
refusal of links that point to nothing (a Hugging Face cache snapshot whose blob was deleted).

Standard library and :mod:`specconv.errors` only, so any room (``format`` and
``tensors`` included) may import it. A directory swap lives in :mod:`specconv.outdir`.
"""

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
    """Write ``data`` (text as UTF-8) to ``path`` atomically: a temp file in the same dir,
    then ``os.replace``, so a reader sees the old file or the new one, never half of one.
    The file gets the mode a plain ``open(..., "w")`` would give it; missing parent
    directories are created.

    Raises:
        OSError: the directory is not writable (no temp file is left behind).
    """
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
    """The JSON object in ``path`` (strict UTF-8).

    Args:
        path: the file.
        code: the error slug (None: ``invalid_input``).
        unreadable: message when the file cannot be read or decoded (I/O, UTF-8, JSON,
            nesting too deep); a ``str.format`` template over ``path`` and ``error``.
        not_object: message when the JSON is valid but no object (same template keys).

    Returns:
        The object (NaN / Infinity literals are accepted here; callers that refuse them check).

    Raises:
        InvalidInputError: either case above, naming the file.
    """
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError, nesting
        raise InvalidInputError(unreadable.format(path=path, error=e), code=code) from e
    if not isinstance(data, dict):
        raise InvalidInputError(not_object.format(path=path, error=None), code=code)
    return data


def hub_cache_snapshot(path: str | os.PathLike[str]) -> tuple[str, str, Path, Path] | None:
    """Where ``path`` lies in a huggingface_hub cache: ``(repo id, revision, cache dir, snapshot
    dir)``, or None. The layout is huggingface_hub 2.4's (``file_download.py``
    ``repo_folder_name``: ``CACHE/models--ORG--NAME/snapshots/REVISION/...``, the ``/`` of the
    repo id written ``--``, which a repo id itself may not contain)."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(len(parts) - 2, 1, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--") and len(parts[i - 1]) > len("models--"):
            repo = parts[i - 1][len("models--"):].replace("--", "/")
            return repo, parts[i + 1], Path(*parts[:i - 1]), Path(*parts[:i + 2])
    return None


#: what a dangling link outside a Hub cache is refused for: the files a reader opens (configs,
#: indexes, weights); any other (a stale ``latest``, a link loop) stays ignored, as before
_READ_SUFFIXES = (".json", ".safetensors", ".bin")


def check_no_dangling_links(root: str | os.PathLike[str], what: str = "") -> None:
    """Refuse a directory holding links that point to nothing (below ``root``, hidden entries
    such as a tool's ``.cache`` skipped): read as missing files they would be misdiagnosed
    ("no config.json", "no draft-body tensors"). In a Hugging Face cache snapshot every such
    link counts (a blob deleted from the cache) and the hint is the ``hf download`` line that
    restores them; elsewhere only links named like a file a reader opens (:data:`_READ_SUFFIXES`).

    Args:
        root: the directory (a source, a drafter dir, a verifier dir). what: how the message
            names it (``"source"``, ``"verifier"``...; empty: the path alone).

    Raises:
        InvalidInputError: ``broken_hub_cache`` (in a cache snapshot) or ``dangling_link``
            (exit 3), naming every such link and its target.
    """
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
