"""``--sliding-window-non-causal``: a convert flag every converter's plan shares.

What the key means (docs/formats.md, "Speculators DFlash causality"):

* speculators 0.9.0 applies ``sliding_window_non_causal`` to sliding-window layers only; a
  full-attention layer is always bidirectional inside the block
  (``src/speculators/models/dflash/attention.py``: ``non_causal = sliding_window is None or
  sliding_window_non_causal``; the key defaults to false, ``models/dflash/config.py``);
* vLLM 0.33 sets ``dflash_config.causal = not sliding_window_non_causal``
  (``vllm/transformers_utils/configs/speculators/algos.py``) and applies that override to
  **every** DFlash layer (``vllm/model_executor/models/qwen3_dflash.py``
  ``_dflash_layer_causal``); for DSpark it ignores the key.

So on a DFlash drafter whose layers are all full attention, ``true`` changes nothing
speculators runs and makes vLLM run the layers bidirectionally, as they were trained:
the flag sets it there, and is refused wherever it would change a trained layer
(a sliding-window layer) or no consumer reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specconv.errors import InvalidInputError

if TYPE_CHECKING:
    from specconv.plan import ConversionPlan

    from .base import ConvertOptions

FLAG = "--sliding-window-non-causal"


def _refusal(plan: ConversionPlan) -> str | None:
    """Why the flag cannot apply to ``plan``'s drafter (None when it can)."""
    from specconv.format.algorithms import algorithm as describe

    alg = describe(plan.algorithm)
    if alg.vllm.sliding_window_non_causal == "not-applicable":
        return f"a {alg.display_name} drafter has no block and no sliding_window_non_causal key"
    if alg.vllm.sliding_window_non_causal != "every-layer":
        return (f"vLLM ignores sliding_window_non_causal for {alg.display_name} (its layers run as layer_types "
                "says), so there is nothing to set")
    types = plan.config.transformer_layer_config.resolved_layer_types
    other = [f"{i} ({t})" for i, t in enumerate(types) if t != "full_attention"]
    if other:
        return (f"draft layer(s) {', '.join(other)} are not full attention: speculators applies "
                "sliding_window_non_causal to sliding-window layers, so true would make them attend "
                "bidirectionally inside the block, which is not how they were trained")
    return None


def apply_sliding_window_non_causal(plan: ConversionPlan, opts: ConvertOptions) -> ConversionPlan:
    """Apply ``--sliding-window-non-causal`` (``opts.sliding_window_non_causal``) to a plan.

    Args:
        plan: a converter's plan (its config typed).
        opts: the conversion options; the flag is recorded with them (``plan.options``).

    Returns:
        ``plan``, its config's ``sliding_window_non_causal`` true when the flag is given (an
        info finding when the source said false).

    Raises:
        InvalidInputError: ``flag_not_applicable`` (exit 3): the drafter is no DFlash, or a
            draft layer is not full attention.
    """
    if not opts.sliding_window_non_causal:
        return plan
    why = _refusal(plan)
    if why is not None:
        raise InvalidInputError(f"{FLAG} does not apply: {why}", code="flag_not_applicable",
                                hint=f"drop {FLAG}")
    if not plan.config.sliding_window_non_causal:
        from specconv.format import Finding

        plan.config.sliding_window_non_causal = True
        plan.findings.append(Finding(
            "info", "sliding-window-non-causal-from-flag",
            f"sliding_window_non_causal false → true ({FLAG}): every draft layer is full attention, so "
            "speculators runs the drafter unchanged and vLLM runs its layers bidirectionally inside the block, "
            "as they were trained", "sliding_window_non_causal"))
    return plan
