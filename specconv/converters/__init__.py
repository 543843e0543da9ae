"""Source-format converters; importing the package imports every module, so each ``@register`` class is in
:data:`REGISTRY`."""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Converter, ConvertOptions, SourceInfo, ordered, register

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_") and _m.name not in ("base", "dispatch"):
        importlib.import_module(f"{__name__}.{_m.name}")


def detect(src: SourceInfo) -> type[Converter] | None:
    """The first candidate converter (:func:`specconv.converters.dispatch.candidates`) whose ``detect`` matches."""
    from .dispatch import detect as _detect

    return _detect(src, REGISTRY)


def algorithms() -> list[str]:
    """Target algorithms of the supported converters (for ``--algorithm`` choices)."""
    from specconv.format.algorithms import algorithm_names

    known = set(algorithm_names())
    return sorted({a for c in REGISTRY.values() if c.supported for a in c.algorithm.split("|") if a in known})


__all__ = ["REGISTRY", "Converter", "ConvertOptions", "SourceInfo", "detect", "ordered", "register", "algorithms"]
