"""Speculative counters → acceptance metrics, and G4's near-tie rule: the arithmetic every served
engine check and the torch loop share (docs/validate.md, "Metrics"). Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["metrics_from_counts", "near_tie"]


def metrics_from_counts(num_drafts: float, num_draft_tokens: float, num_accepted_tokens: float,
                        accepted_per_pos: Sequence[float]) -> dict:
    """τ (``acceptance_length``, 1.0 without drafts), α (``acceptance_rate``, None without draft tokens),
    p_i (``acceptance_at_pos``) and c_i (``conditional_acceptance_at_pos``) of vLLM-style counters,
    bonus token included, plus the counts."""
    T = float(num_drafts)
    tau = 1.0 + float(num_accepted_tokens) / T if T > 0 else 1.0
    p = [float(x) / T if T > 0 else 0.0 for x in accepted_per_pos]
    c, prev = [], 1.0
    for pi in p:
        c.append(pi / prev if prev > 0 else 0.0)
        prev = pi
    return {"num_drafts": int(num_drafts), "num_draft_tokens": int(num_draft_tokens),
            "num_accepted_tokens": int(num_accepted_tokens), "acceptance_length": tau,
            "acceptance_rate": float(num_accepted_tokens) / float(num_draft_tokens) if num_draft_tokens else None,
            "acceptance_at_pos": p, "conditional_acceptance_at_pos": c}


def near_tie(gap: float, top1: float, dtype: str) -> bool:
    """Near-tie rule of G4 (``docs/validate.md``): fp32 gap < 1e-3·|top-1 logit|; bf16/fp16 gap < 0.05."""
    if dtype in ("float32", "float64"):
        return gap < 1e-3 * max(abs(top1), 1.0)
    return gap < 0.05
