"""Facts about the Speculators target format, each written once (per-algorithm ones: :mod:`.algorithms`).

Sources: speculators 0.9.0 ``src/speculators/config.py``, ``src/speculators/models/{peagle,dflash,dspark}/config.py``,
``src/speculators/proposals/greedy.py``; vLLM 0.33 ``vllm/transformers_utils/configs/speculators/{algos,base}.py``,
``vllm/config/speculative.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CONFIG_DTYPE_TO_ST", "FLOAT_DTYPES", "MAX_DRAFT_LAYERS", "NEVER_WRITTEN", "SPECULATORS_VERSION",
           "LAYER_KEY_SCOPES", "UNSUPPORTED_LAYER_KEYS", "disputed_layout", "layout_name", "legacy_sample_from_anchor",
           "speculative_tokens_for", "speculators_envelope", "unsupported_layer_keys"]

#: ``speculators_version`` written into every config (the reference release).
SPECULATORS_VERSION = "0.9.0"

#: Keys never written at the top level: a top-level ``model_type`` sends vLLM down the
#: plain AutoConfig path; ``auto_map`` is a ``save_pretrained`` artefact nobody reads.
NEVER_WRITTEN: tuple[str, ...] = ("model_type", "auto_map")

#: Sanity bound on draft decoder layers (drafters have 1-8; the lint enumerates each).
MAX_DRAFT_LAYERS = 1024

#: safetensors dtype strings of float tensors.
FLOAT_DTYPES: frozenset[str] = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})

#: Gated-attention layer keys no Speculators drafter (speculators 0.9.0, vLLM 0.33) implements (DeepSpec's
#: ``attn_output_gate``, ``deepspec/modeling/dspark/qwen3/modeling.py``; the gated Qwen variants' spellings);
#: refused when truthy at convert and by the reference drafters.
UNSUPPORTED_LAYER_KEYS: tuple[str, ...] = (
    "attn_output_gate", "use_gated_attention", "gated_attention",
    "headwise_attn_output_gate", "elementwise_attn_output_gate",
)

#: Where a config holds layer-architecture keys: the top level (``""``, flat HF decoder
#: configs), the DFlash / DSpark drafter blocks and a Speculators-style layer config.
LAYER_KEY_SCOPES: tuple[str, ...] = ("", "dflash_config", "dspark_config", "transformer_layer_config")


def unsupported_layer_keys(cfg: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """``[(dotted location, value)]`` of each truthy :data:`UNSUPPORTED_LAYER_KEYS` in every scope of ``cfg``
    as read (a converter may drop or re-nest them), e.g. ``[("dflash_config.attn_output_gate", True)]``."""
    hits: list[tuple[str, Any]] = []
    for scope in LAYER_KEY_SCOPES:
        block = cfg.get(scope) if scope and isinstance(cfg, Mapping) else cfg
        if not isinstance(block, Mapping):
            continue
        hits += [(f"{scope}.{k}" if scope else k, block[k]) for k in UNSUPPORTED_LAYER_KEYS if block.get(k)]
    return hits


#: config ``dtype`` value → safetensors dtype string.
CONFIG_DTYPE_TO_ST: dict[str, str] = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
                                      "half": "F16", "float": "F32"}


def speculative_tokens_for(block_size: int, sample_from_anchor: bool) -> int:
    """The K rule of a block drafter: ``B`` (anchor-first) or ``B - 1`` (1+N: slot 0 is the bonus token)
    (speculators ``models/dflash/config.py``)."""
    return block_size if sample_from_anchor else block_size - 1


def legacy_sample_from_anchor(block_size: int, speculative_tokens: Any) -> bool | None:
    """The legacy rule for a config without ``sample_from_anchor`` (early speculators releases): the K rule
    run backwards, ``K == B - 1`` → false, ``K == B`` → true, else None."""
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
    """One sentence for a refusal naming both readings of a missing ``sample_from_anchor``: the K rule's
    (``k_rule``) and speculators 0.9.0's class default."""
    rule = "block_size" if k_rule else "block_size-1"
    return (f"the K rule reads {str(k_rule).lower()} (speculative_tokens {speculative_tokens} == {rule}: "
            f"{layout_name(k_rule)}) but speculators {SPECULATORS_VERSION} reads its {display_name} default "
            f"{str(speculators_default).lower()} ({layout_name(speculators_default)}, "
            f"{speculative_tokens_for(block_size, speculators_default)} drafts)")


def speculators_envelope(algorithm: str, speculative_tokens: int, verifier_name_or_path: str | None,
                         verifier_architectures: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON-ready ``speculators_config``: one greedy proposal method (K) and the verifier."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                              "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures or [])},
    }
