"""Facts about the Speculators target format, each written once.

Every other module (the typed configs, the converters, the lint, the reference drafters)
takes these from here instead of restating them; per-algorithm facts (architecture, serve
method, aux-id key, layer-0 width, ...) live in the descriptions of :mod:`.algorithms`.
Sources: speculators 0.9.0 ``src/speculators/config.py``,
``src/speculators/models/{peagle,dflash,dspark}/config.py`` and
``src/speculators/proposals/greedy.py``; vLLM 0.33
``vllm/transformers_utils/configs/speculators/{algos,base}.py`` and
``vllm/config/speculative.py``. The rules are explained for users in ``docs/formats.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CONFIG_DTYPE_TO_ST",
    "FLOAT_DTYPES",
    "MAX_DRAFT_LAYERS",
    "NEVER_WRITTEN",
    "SPECULATORS_VERSION",
    "LAYER_KEY_SCOPES",
    "UNSUPPORTED_LAYER_KEYS",
    "disputed_layout",
    "layout_name",
    "legacy_sample_from_anchor",
    "speculative_tokens_for",
    "speculators_envelope",
    "unsupported_layer_keys",
]

#: ``speculators_version`` written into every config (the reference release).
SPECULATORS_VERSION = "0.9.0"

#: Keys never written at the top level: a top-level ``model_type`` sends vLLM down the
#: plain AutoConfig path; ``auto_map`` is a ``save_pretrained`` artefact nobody reads.
NEVER_WRITTEN: tuple[str, ...] = ("model_type", "auto_map")

#: Sanity bound on draft decoder layers (drafters have 1-8; the lint enumerates each).
MAX_DRAFT_LAYERS = 1024

#: safetensors dtype strings of float tensors.
FLOAT_DTYPES: frozenset[str] = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})

#: Layer-architecture keys no Speculators drafter (speculators 0.9.0, vLLM 0.33) implements:
#: a gate on the attention output, with extra weights a plain Llama / Qwen3 layer cannot
#: hold — DeepSpec's ``attn_output_gate`` (``deepspec/modeling/dspark/qwen3/modeling.py``),
#: the head-wise / element-wise spellings of the gated-attention Qwen variants, and two
#: generic names. Set (truthy) anywhere a converter reads layer keys, they are refused at
#: convert (:func:`unsupported_layer_keys`); the reference drafters refuse them in
#: ``transformer_layer_config`` (``specconv/drafters/layers.py``).
UNSUPPORTED_LAYER_KEYS: tuple[str, ...] = (
    "attn_output_gate", "use_gated_attention", "gated_attention",
    "headwise_attn_output_gate", "elementwise_attn_output_gate",
)

#: Where a config holds layer-architecture keys: the top level (``""``, flat HF decoder
#: configs), the DFlash / DSpark drafter blocks and a Speculators-style layer config.
LAYER_KEY_SCOPES: tuple[str, ...] = ("", "dflash_config", "dspark_config", "transformer_layer_config")


def unsupported_layer_keys(cfg: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """The :data:`UNSUPPORTED_LAYER_KEYS` set in ``cfg``, in every :data:`LAYER_KEY_SCOPES`.

    A converter drops or re-nests keys (``dflash_config`` is hoisted, DeepSpec's keys are
    filtered), so a key checked only in the written config would be invisible to the lint;
    this runs on the source config as read.

    Args:
        cfg: a parsed config (``None``: nothing to check).

    Returns:
        ``[(dotted location, value)]`` of every truthy one, e.g.
        ``[("dflash_config.attn_output_gate", True)]`` (empty when none).
    """
    hits: list[tuple[str, Any]] = []
    for scope in LAYER_KEY_SCOPES:
        block = cfg.get(scope) if scope and isinstance(cfg, Mapping) else cfg
        if not isinstance(block, Mapping):
            continue
        hits += [(f"{scope}.{k}" if scope else k, block[k]) for k in UNSUPPORTED_LAYER_KEYS if block.get(k)]
    return hits


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
    for sample_from_anchor in (False, True):
        if speculative_tokens == speculative_tokens_for(block_size, sample_from_anchor):
            return sample_from_anchor
    return None


def layout_name(sample_from_anchor: bool) -> str:
    """``"anchor-first"`` (every slot drafts, K = B) or ``"1+N"`` (slot 0 is the bonus token, K = B - 1)."""
    return "anchor-first" if sample_from_anchor else "1+N"


def disputed_layout(block_size: int, speculative_tokens: int, k_rule: bool, speculators_default: bool,
                    display_name: str) -> str:
    """The two readings of a block drafter's config without ``sample_from_anchor``, for a
    refusal: the K rule run backwards (:func:`legacy_sample_from_anchor`) and the value
    speculators 0.9.0 reads instead (its config class default for the algorithm).

    Args:
        block_size: ``B``. speculative_tokens: K as written. k_rule: the K rule's reading.
        speculators_default: speculators' class default. display_name: e.g. ``"DSpark"``.

    Returns:
        One sentence naming both readings, e.g. ``"the K rule reads false (speculative_tokens
        3 == block_size-1: 1+N) but speculators 0.9.0 reads its DSpark default true
        (anchor-first, 4 drafts)"``.
    """
    rule = "block_size" if k_rule else "block_size-1"
    return (f"the K rule reads {str(k_rule).lower()} (speculative_tokens {speculative_tokens} == {rule}: "
            f"{layout_name(k_rule)}) but speculators {SPECULATORS_VERSION} reads its {display_name} default "
            f"{str(speculators_default).lower()} ({layout_name(speculators_default)}, "
            f"{speculative_tokens_for(block_size, speculators_default)} drafts)")


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
