"""The engine registry: every consumer of Speculators drafters (vLLM, SGLang, llama.cpp, ONNX Runtime,
TensorRT, and any plug-in) declared once as an :class:`~specconv.engines.base.Engine` and found
through the entry-point group :data:`ENTRY_POINT_GROUP` (specconv's own ``pyproject.toml`` lists the
built-ins). Generic code iterates :func:`engines` and never names one (docs/architecture.md,
"Adding an engine"). Importing this module imports no engine and nothing heavy.
"""

from __future__ import annotations

import functools
import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from .base import Engine, LoadCheck, Serve

__all__ = ["ENTRY_POINT_GROUP", "engine", "engines", "exporters", "find_engine", "load_checks", "reset", "serves",
           "with_capability"]

log = logging.getLogger("specconv.engines")

#: The entry-point group engines are declared in (``name = "module:ENGINE"``).
ENTRY_POINT_GROUP = "specconv.engines"


def _declared() -> list[tuple[str, str]]:
    """``(name, "module:attribute")`` of every entry point of the group, in ``sys.path`` order (the
    first declaration of a name wins, as Python's own metadata lookup does).

    Only the ``entry_points.txt`` files that name the group are parsed: ``importlib.metadata``'s
    ``entry_points()`` parses every installed distribution, about 85 ms for 200 of them, which
    ``specconv convert`` would pay for its card. A source checkout run without an installed
    specconv (``PYTHONPATH=.``) has no metadata: its ``pyproject.toml`` lists the built-ins then.
    """
    from importlib.metadata import PathDistribution

    out: dict[str, str] = {}
    own = False
    for dist_dir in _dist_dirs_naming_the_group():
        dist = PathDistribution(dist_dir)
        own = own or (dist.metadata["Name"] or "").lower() == "specconv"
        for ep in dist.entry_points.select(group=ENTRY_POINT_GROUP):
            out.setdefault(ep.name, ep.value)
    if not own:
        for name, value in _checkout_entry_points():
            out.setdefault(name, value)
    return list(out.items())


def _dist_dirs_naming_the_group() -> list[Path]:
    """The ``*.dist-info`` / ``*.egg-info`` dirs on ``sys.path`` whose ``entry_points.txt`` has the group."""
    import os
    import sys

    header = f"[{ENTRY_POINT_GROUP}]"
    found = []
    for entry in sys.path:
        try:
            scan = os.scandir(entry or ".")
        except OSError:
            continue
        with scan:
            for e in scan:
                if not e.name.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(e.path, "entry_points.txt"), encoding="utf-8") as f:
                        named = header in f.read()
                except OSError:
                    continue
                if named:
                    found.append(Path(e.path))
    return found


def _checkout_entry_points() -> list[tuple[str, str]]:
    """The group's table of the ``pyproject.toml`` of a source checkout (none: [])."""
    import tomllib

    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    table = data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return [(str(k), str(v)) for k, v in table.items()]


def _load(name: str, value: str) -> Engine:
    from .base import Engine

    module, _, attr = value.partition(":")
    obj = getattr(importlib.import_module(module), attr or "ENGINE")
    if not isinstance(obj, Engine):
        raise TypeError(f"entry point {ENTRY_POINT_GROUP}:{name} = {value!r} is not an Engine")
    if obj.key != name:
        raise TypeError(f"entry point {ENTRY_POINT_GROUP}:{name} declares the engine {obj.key!r}")
    return obj


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, Engine]:
    found = [_load(name, value) for name, value in _declared()]
    return {e.key: e for e in sorted(found, key=lambda e: (e.order, e.key))}


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in listing order (the built-ins first)."""
    return tuple(_registry().values())


def find_engine(key: str) -> Engine | None:
    """The engine registered as ``key``, or None."""
    return _registry().get(key)


def engine(key: str) -> Engine:
    """The engine registered as ``key``.

    Raises:
        UsageError: no such engine (exit 2), naming the registered ones.
    """
    found = find_engine(key)
    if found is None:
        raise UsageError(f"unknown engine {key!r} (registered: {', '.join(_registry())})")
    return found


def with_capability(name: str) -> tuple[Engine, ...]:
    """The engines that have capability ``name`` (``export``, ``serve``, ``load_check``, ``runtime``)."""
    return tuple(e for e in engines() if getattr(e, name) is not None)


def serves() -> tuple[tuple[str, Serve], ...]:
    """``(engine key, its serve capability)`` of every engine that serves, in registry order."""
    return tuple((e.key, e.serve) for e in engines() if e.serve is not None)


def load_checks() -> tuple[tuple[str, LoadCheck], ...]:
    """``(engine key, its loader check)`` of every engine that has one, in registry order."""
    return tuple((e.key, e.load_check) for e in engines() if e.load_check is not None)


def exporters() -> list[Any]:
    """Every registered export capability, in registry order."""
    return [e.export for e in with_capability("export")]


def engine_option_defaults() -> dict[str, Any]:
    """Every engine's plain options (its own and its ``serve``'s) at their defaults: dest → value."""
    out: dict[str, Any] = {}
    for e in engines():
        for spec in (*e.options, *(e.serve.options if e.serve is not None else ())):
            out.setdefault(spec.dest, spec.default)
    return out


def reset() -> None:
    """Forget the registry (the next call discovers the engines again; for tests that add one)."""
    _registry.cache_clear()
