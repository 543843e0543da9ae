"""Reference PyTorch drafters for Speculators-format P-EAGLE / DFlash / DSpark dirs.

One small module per algorithm runs one drafting step exactly as
speculators_format.md §3.3 / §4.3 / §5.3 describe. Public API::

    from specconv.drafters import load_drafter
    drafter = load_drafter(spec_dir, verifier_dir, dtype=torch.float32, device="cpu")
    prop = drafter.propose(context_tokens[1, T+1], aux_hidden[1, T, A*H], temperature=0.0)
    prop.tokens  # LongTensor[k] target ids; prop.logits [k, Vt]; prop.confidence [k] | None
    out = drafter.forward_block(...)  # BlockOutput: per-slot draft/target logits, hidden

Importing this package imports torch; the CLI must import it lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "load_drafter",
    "read_drafter_config",
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
    "read_drafter_config": "loader",
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

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
