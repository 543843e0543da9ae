"""Source-format converters, installed as ``specconv.converters``.

Importing this package imports every module in it, so each ``@register``-decorated
converter lands in :data:`REGISTRY`. ``detect(src)`` tries only the candidates the
source's discriminators select (:mod:`specconv.converters.dispatch`).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Converter, ConvertOptions, SourceInfo, ordered, register

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_") and _m.name not in ("base", "dispatch"):
        importlib.import_module(f"{__name__}.{_m.name}")


def detect(src: SourceInfo) -> type[Converter] | None:
    """Return the first candidate converter whose ``detect`` matches ``src`` (or ``None``).

    The candidates and their order come from the source's discriminators
    (``speculators_model_type``, ``projector_type``, ``architectures[0]``, markers):
    :func:`specconv.converters.dispatch.candidates`.
    """
    from .dispatch import detect as _detect

    return _detect(src, REGISTRY)


def algorithms() -> list[str]:
    """Target algorithms of the supported converters (for ``--algorithm`` choices)."""
    from specconv.format.algorithms import algorithm_names

    known = set(algorithm_names())
    return sorted({a for c in REGISTRY.values() if c.supported for a in c.algorithm.split("|") if a in known})


__all__ = ["REGISTRY", "Converter", "ConvertOptions", "SourceInfo", "detect", "ordered", "register", "algorithms"]
