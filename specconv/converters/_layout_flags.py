"""``--sliding-window-non-causal``: a convert flag every converter's plan shares (docs/adding_a_converter.md)."""

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
    """Apply ``--sliding-window-non-causal`` to a plan: its ``sliding_window_non_causal`` true (an info finding
    when the source said false).

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
