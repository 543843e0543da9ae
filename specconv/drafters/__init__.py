"""Reference PyTorch drafters for Speculators-format P-EAGLE / DFlash / DFlash2 / DSpark dirs (one module per
algorithm, its docstring the drafting step). Importing the package does not import torch; the first
attribute access does (MissingExtraError without it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_drafter", "Drafter", "DraftProposal", "BlockOutput", "VocabMap", "PEagleDrafter", "DFlashDrafter",
           "DSparkDrafter"]

_WHERE = {"load_drafter": "loader", "Drafter": "base", "DraftProposal": "base", "BlockOutput": "base",
          "VocabMap": "base", "PEagleDrafter": "peagle", "DFlashDrafter": "dflash", "DSparkDrafter": "dspark"}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from ..extras import require

    require("torch", "validate", feature="the reference drafters (specconv.drafters)")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
