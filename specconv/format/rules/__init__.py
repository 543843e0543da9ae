"""The servability lint of a Speculators draft: what speculators and vLLM need to load and serve it
faithfully (rules registered in :mod:`.envelope_rules`, :mod:`.layout_rules`, :mod:`.tensor_rules`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ...errors import InvalidInputError
from ..findings import Finding, finding, sort_findings
from ..schema import SpeculatorsDraftConfig, load_config
from ..verifier_facts import VerifierFacts
from . import envelope_rules, layout_rules, tensor_rules  # noqa: F401  (register the rules)
from .registry import RULES, LintContext, rule, run_rules

__all__ = ["RULES", "lint", "lint_dir", "rule"]

#: Training artefacts that must not be published with a draft.
_LEFTOVERS = ("optimizer_state_dict.pt", "scheduler_state_dict.pt", "train_command.txt", "run.yaml")


def lint(cfg: SpeculatorsDraftConfig, tensors: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
         verifier: VerifierFacts | None = None, *, serve_method: str | None = None) -> list[Finding]:
    """Servability lint of a Speculators draft; findings errors first, then in rule order.

    ``tensors``: ``name -> (shape, safetensors dtype)`` (e.g. ``((64, 192), "BF16")``); ``serve_method``:
    vLLM's ``--speculative-config`` method. A None input skips the rules that need it.
    """
    ctx = LintContext(cfg, tensors, verifier, serve_method)
    return sort_findings(run_rules(ctx))


def _read_tensor_headers(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names → (shape, safetensors dtype) of a draft directory's weights, from the headers only."""
    from ...tensors import TensorStore

    store = TensorStore.open(path)
    return {name: (tuple(store.info(name).shape), store.info(name).dtype) for name in store.names()}


def _dir_findings(p: Path, has_weights: bool) -> list[Finding]:
    out = []
    if not has_weights:
        out.append(finding("weights-missing", f"{p}: no model.safetensors (or other weights file) found"))
    left = [n for n in _LEFTOVERS if (p / n).exists()]
    if left:
        out.append(finding("training-leftovers", f"training leftovers {left} should not be published", left[0]))
    return out


def lint_dir(path: str | os.PathLike[str], verifier: VerifierFacts | None = None, *, serve_method: str | None = None,
             config: SpeculatorsDraftConfig | None = None) -> list[Finding]:
    """:func:`lint` of a draft directory (config.json + tensor headers) plus its directory findings.

    Raises InvalidInputError: ``config.json`` missing or invalid, or unreadable weights.
    """
    p = Path(path)
    if not p.is_dir():
        raise InvalidInputError(f"{p}: not a directory")
    cfg = config if config is not None else load_config(p)
    has_weights = any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin"))
    tensors = _read_tensor_headers(p) if has_weights else None
    findings = lint(cfg, tensors, verifier, serve_method=serve_method)
    return sort_findings(findings + _dir_findings(p, has_weights))
