"""Reference PyTorch drafters for Speculators-format P-EAGLE / DFlash / DSpark dirs.

One module per algorithm; its docstring spells out its drafting step and the speculators 0.9.0
and vLLM files it follows. The one step and who runs it: ``docs/architecture.md``
(``specconv/drafters/``). Public API::

    from specconv.drafters import load_drafter
    drafter = load_drafter(spec_dir, verifier, config=typed, dtype=torch.float32, device="cpu")
    prop = drafter.propose(context_tokens[1, T+1], aux_hidden[1, T, A*H], temperature=0.0)
    prop.tokens  # LongTensor[k] target ids; prop.logits [k, Vt]; prop.confidence [k] | None
    out = drafter.forward_block(...)  # BlockOutput: per-slot draft/target logits, hidden

Importing this package does not import torch; the first attribute access does (and
without torch raises :class:`specconv.extras.MissingExtraError` naming
``pip install 'specconv[validate]'``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "load_drafter",
    "Drafter",
    "DraftProposal",
    "BlockOutput",
    "VocabMap",
    "PEagleDrafter",
    "DFlashDrafter",
    "DSparkDrafter",
]

_WHERE = {
    "load_drafter": "loader",
    "Drafter": "base",
    "DraftProposal": "base",
    "BlockOutput": "base",
    "VocabMap": "base",
    "PEagleDrafter": "peagle",
    "DFlashDrafter": "dflash",
    "DSparkDrafter": "dspark",
}


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
