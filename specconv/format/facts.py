"""Facts about the Speculators target format, each written once.

Every other module (the typed configs, the converters, the lint, the reference drafters)
takes these from here instead of restating them. Sources: speculators 0.9.0
``src/speculators/config.py``, ``src/speculators/models/{peagle,dflash,dspark}/config.py``
and ``src/speculators/proposals/greedy.py``; vLLM 0.33
``vllm/transformers_utils/configs/speculators/algos.py``. The rules are explained for users
in ``docs/formats.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .algorithms import ALGORITHMS as _ALGORITHMS
from .algorithms import algorithm as _algorithm

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "BLOCK_ALGORITHMS",
    "CONFIG_DTYPE_TO_ST",
    "FLOAT_DTYPES",
    "MAX_DRAFT_LAYERS",
    "NEVER_WRITTEN",
    "SERVE_METHODS",
    "SPECULATORS_VERSION",
    "aux_ids_key",
    "layer0_input_width",
    "legacy_sample_from_anchor",
    "speculative_tokens_for",
    "speculators_envelope",
]

#: Algorithms (``speculators_model_type`` values) specconv writes and reads, from their
#: descriptions (:mod:`.algorithms`, the one owner of per-algorithm facts).
ALGORITHMS: tuple[str, ...] = tuple(_ALGORITHMS)

#: The block drafters: one pass fills ``block_size`` query slots.
BLOCK_ALGORITHMS: frozenset[str] = frozenset(a.name for a in _ALGORITHMS.values() if a.block_drafter)

#: ``architectures`` that speculators' ``save_pretrained`` writes (the pydantic defaults
#: such as ``PEagleSpeculator`` are never seen on disk).
ARCHITECTURES: dict[str, str] = {a.name: a.architecture for a in _ALGORITHMS.values()}

#: The ``method`` of vLLM's ``--speculative-config`` that serves each algorithm.
SERVE_METHODS: dict[str, str] = {a.name: a.vllm.method for a in _ALGORITHMS.values()}

#: ``speculators_version`` written into every config (the reference release).
SPECULATORS_VERSION = "0.9.0"

#: Keys never written at the top level: a top-level ``model_type`` sends vLLM down the
#: plain AutoConfig path; ``auto_map`` is a ``save_pretrained`` artefact nobody reads.
NEVER_WRITTEN: tuple[str, ...] = ("model_type", "auto_map")

#: Sanity bound on draft decoder layers (drafters have 1-8; the lint enumerates each).
MAX_DRAFT_LAYERS = 1024

#: safetensors dtype strings of float tensors.
FLOAT_DTYPES: frozenset[str] = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})

#: config ``dtype`` value → safetensors dtype string.
CONFIG_DTYPE_TO_ST: dict[str, str] = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "half": "F16",
    "float": "F32",
}


def speculative_tokens_for(block_size: int, sample_from_anchor: bool) -> int:
    """The K rule: drafts per pass of a block drafter (DFlash, DSpark).

    With ``sample_from_anchor`` every one of the ``block_size`` slots predicts a token
    (anchor-first layout); without it slot 0 carries the bonus token and ``block_size - 1``
    slots draft (1+N layout). speculators ``models/dflash/config.py``; vLLM reads the
    result as ``num_speculative_tokens``.

    Args:
        block_size: ``B``, query slots per drafting pass, anchor included.
        sample_from_anchor: the layout flag.

    Returns:
        ``B`` or ``B - 1`` (``speculators_config.proposal_methods[0].speculative_tokens``).
    """
    return block_size if sample_from_anchor else block_size - 1


def legacy_sample_from_anchor(block_size: int, speculative_tokens: Any) -> bool | None:
    """The documented legacy rule for a config written without ``sample_from_anchor``.

    Early speculators releases did not write the key; the layout is then told by the
    K rule run backwards: ``K == B - 1`` means 1+N (false), ``K == B`` anchor-first (true).

    Args:
        block_size: ``B`` from the same config.
        speculative_tokens: ``proposal_methods[0].speculative_tokens`` as read (any type).

    Returns:
        The layout flag, or ``None`` when K is neither ``B - 1`` nor ``B`` (undecidable).
    """
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int):
        return None
    for sfa in (False, True):
        if speculative_tokens == speculative_tokens_for(block_size, sfa):
            return sfa
    return None


def speculators_envelope(
    algorithm: str,
    speculative_tokens: int,
    verifier_name_or_path: str | None,
    verifier_architectures: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``speculators_config`` object: one greedy proposal method and the verifier.

    speculators ``src/speculators/config.py`` (``SpeculatorsConfig``) and
    ``src/speculators/proposals/greedy.py``; vLLM reads only
    ``proposal_methods[0].speculative_tokens``.

    Args:
        algorithm: ``speculators_model_type`` of the draft.
        speculative_tokens: K.
        verifier_name_or_path: Hub id (or path) of the verifier.
        verifier_architectures: the verifier's ``architectures``.

    Returns:
        A plain JSON-ready dict.
    """
    return {
        "algorithm": algorithm,
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": speculative_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {
            "name_or_path": verifier_name_or_path,
            "architectures": list(verifier_architectures or []),
        },
    }


def aux_ids_key(algorithm: str) -> str:
    """Name of the aux hidden-state layer-id key for ``algorithm`` (its description's)."""
    return _algorithm(algorithm).aux_ids_key


def layer0_input_width(algorithm: str, hidden_size: int) -> int:
    """Input width of layer 0's q/k/v projections (:meth:`.algorithms.Algorithm.layer0_input_width`:
    P-EAGLE's first layer attends over ``cat(embedding, fc(aux))``, ``2·H``, speculators
    ``models/peagle/core.py``; DFlash and DSpark layers take ``H``)."""
    return _algorithm(algorithm).layer0_input_width(hidden_size)
