"""The two file helpers every room shares: an atomic file write and reading a JSON object.

Standard library and :mod:`specconv.errors` only, so any room (``format`` and
``tensors`` included) may import it. A directory swap lives in :mod:`specconv.outdir`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import InvalidInputError

__all__ = ["atomic_write", "read_json_object"]


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
