"""Source-format converters, installed as ``specconv.converters``.

Importing this package imports every module in it, so each ``@register``-decorated
converter lands in :data:`REGISTRY`. ``detect(src)`` walks them in the order of the
detection decision tree (external_formats.md §16).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Converter, ConvertOptions, SourceInfo, ordered, register

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_") and _m.name != "base":
        importlib.import_module(f"{__name__}.{_m.name}")


def detect(src: SourceInfo) -> type[Converter] | None:
    """Return the first converter whose ``detect`` matches ``src`` (or ``None``)."""
    for cls in ordered():
        if cls.detect(src):
            return cls
    return None


def algorithms() -> list[str]:
    """Target algorithms of the supported converters (for ``--algorithm`` choices)."""
    known = {"peagle", "dflash", "dspark"}
    return sorted({a for c in REGISTRY.values() if c.supported for a in c.algorithm.split("|") if a in known})


__all__ = ["REGISTRY", "Converter", "ConvertOptions", "SourceInfo", "detect", "ordered", "register", "algorithms"]
