"""Versions of the libraries a stage's output depends on (recorded in ``specconv.json``,
``validation.json`` and ``onnx_meta.json``), read from the installed distributions."""

from __future__ import annotations

import platform
from collections.abc import Iterable

from . import __version__


def library_versions(dists: Iterable[str]) -> dict[str, str | None]:
    """``{"python", "specconv", *dists}`` → version; a distribution that is not installed
    maps to ``None``. ``specconv`` is this package's own ``__version__``."""
    import importlib.metadata as md

    out: dict[str, str | None] = {"python": platform.python_version(), "specconv": __version__}
    for name in dists:
        if name == "specconv":
            continue
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out
