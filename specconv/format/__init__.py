"""The Speculators target format: typed configs, target facts, expected tensors, findings and the lint.

Names load on first use (PEP 562): :mod:`.names` or :mod:`.facts` alone cost no pydantic; never torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name → the submodule that defines it
_EXPORTS: dict[str, str] = {
    "ALGORITHMS": "algorithms",
    "Algorithm": "algorithms",
    "BlockDraftConfig": "schema",
    "CODES": "findings",
    "CodeInfo": "findings",
    "DFlash2Config": "schema",
    "DFlashConfig": "schema",
    "DSparkConfig": "schema",
    "Finding": "findings",
    "GreedyProposal": "schema",
    "LINT_RULES": "findings",
    "Level": "findings",
    "PEagleConfig": "schema",
    "SPECULATORS_VERSION": "facts",
    "SpeculatorsDraftConfig": "schema",
    "SpeculatorsSection": "schema",
    "TensorSpec": "tensors",
    "VerifierFacts": "verifier_facts",
    "VerifierRef": "schema",
    "algorithm": "algorithms",
    "config_class": "schema",
    "config_to_dict": "schema",
    "dump_config": "schema",
    "expected_speculative_tokens": "schema",
    "expected_tensors": "tensors",
    "find_algorithm": "algorithms",
    "finding": "findings",
    "has_errors": "findings",
    "is_hub_repo_id": "verifier_facts",
    "legacy_sample_from_anchor": "facts",
    "lint": "rules",
    "lint_dir": "rules",
    "load_config": "schema",
    "make_config": "construct",
    "parse_config": "schema",
    "read_added_special_tokens": "verifier_facts",
    "read_config": "schema",
    "resolve_layer_types": "schema",
    "rope_theta_of": "schema",
    "sort_findings": "findings",
    "speculative_tokens_for": "facts",
    "speculators_default": "schema",
    "speculators_envelope": "facts",
    "speculators_model_type_of": "schema",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load ``name`` from its submodule on first use (module ``__getattr__``, PEP 562)."""
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
