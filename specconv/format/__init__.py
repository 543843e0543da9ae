"""The Speculators target format: typed configs, target facts, expected tensors,
findings and the servability lint.

Modules: :mod:`.facts` (the K rule, the legacy ``sample_from_anchor`` rule, the
``speculators_config`` envelope, version, algorithms, layer-0 input width),
:mod:`.schema` (typed configs, the only ``config.json`` parser), :mod:`.construct`
(:func:`make_config`), :mod:`.verifier_facts`, :mod:`.tensors` (expected tensors with
shapes), :mod:`.findings` (the finding-code registry) and :mod:`.lint` (rules registered
by decorator). Imports only pydantic and the standard library (tensor headers are read
lazily in :func:`lint_dir`), so the CLI can import it without torch.
"""

from __future__ import annotations

from .construct import make_config
from .facts import (
    ALGORITHMS,
    ARCHITECTURES,
    SERVE_METHODS,
    SPECULATORS_VERSION,
    aux_ids_key,
    layer0_input_width,
    legacy_sample_from_anchor,
    speculative_tokens_for,
    speculators_envelope,
)
from .findings import CODES, LINT_RULES, CodeInfo, Finding, Level, finding, has_errors, sort_findings
from .lint import lint, lint_dir
from .schema import (
    BlockDraftConfig,
    DFlashConfig,
    DSparkConfig,
    GreedyProposal,
    PEagleConfig,
    SpeculatorsDraftConfig,
    SpeculatorsSection,
    VerifierRef,
    config_class,
    config_to_dict,
    dump_config,
    expected_speculative_tokens,
    load_config,
    parse_config,
    read_config,
    resolve_layer_types,
    rope_theta_of,
    speculators_model_type_of,
)
from .tensors import TensorSpec, expected_tensors
from .verifier_facts import VerifierFacts, is_hub_repo_id, read_added_special_tokens

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "CODES",
    "LINT_RULES",
    "SERVE_METHODS",
    "SPECULATORS_VERSION",
    "BlockDraftConfig",
    "CodeInfo",
    "DFlashConfig",
    "DSparkConfig",
    "Finding",
    "GreedyProposal",
    "Level",
    "PEagleConfig",
    "SpeculatorsDraftConfig",
    "SpeculatorsSection",
    "TensorSpec",
    "VerifierFacts",
    "VerifierRef",
    "aux_ids_key",
    "config_class",
    "config_to_dict",
    "dump_config",
    "expected_speculative_tokens",
    "expected_tensors",
    "finding",
    "has_errors",
    "is_hub_repo_id",
    "layer0_input_width",
    "legacy_sample_from_anchor",
    "lint",
    "lint_dir",
    "load_config",
    "make_config",
    "parse_config",
    "read_added_special_tokens",
    "read_config",
    "resolve_layer_types",
    "rope_theta_of",
    "sort_findings",
    "speculative_tokens_for",
    "speculators_model_type_of",
    "speculators_envelope",
]
