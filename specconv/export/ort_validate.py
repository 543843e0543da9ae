"""``specconv validate DIR --onnx PATH``: the acceptance loop with ONNX Runtime drafting.

Runs the same requests as the torch speculative run with :class:`~.ort_drafter.OrtDrafter`
as the drafter (each step also compared with the torch drafter on the same inputs) and
reports both side by side. Pass rule (greedy): generated tokens identical to the torch
run; drafts identical except where the torch top-1/top-2 margin is below 1e-4 (counted);
τ equal when no such near-tie difference occurred.
"""

from __future__ import annotations

__all__ = ["onnx_acceptance", "apply_onnx_gate", "NEAR_TIE_MARGIN"]

NEAR_TIE_MARGIN = 1e-4


def onnx_acceptance(onnx_path: str, drafter_dir, drafter, run, spec_results, plain, k: int, opts) -> dict:
    """Run the ORT-drafted loop and compare it with the torch run.

    Args:
        onnx_path: ``--onnx`` PATH.
        drafter_dir: the Speculators dir (the graph must be exported from it).
        drafter: the torch reference drafter (already loaded).
        run: ``run(name, drafter, **kw)`` of :func:`specconv.validate.run.validate_drafter`.
        spec_results, plain: the torch speculative and plain-decode request results.
        k: drafts per step.
        opts: the validate options (``seed``, ``dtype``, ``temperature``).

    Returns:
        ``{"graph", "torch": {...}, "onnx": {...}, "drafts": counts, "tokens_identical",
        "tau_equal", "passed"}``.
    """
    from ..validate.metrics import compute_metrics
    from .ort_drafter import ComparingDrafter, OrtDrafter

    ort = OrtDrafter(onnx_path, drafter_dir, dtype=opts.dtype)
    cmp = ComparingDrafter(ort, drafter, margin=NEAR_TIE_MARGIN)
    ort_results = run("speculative decode (ONNX Runtime drafter)", cmp)
    m_t = compute_metrics(spec_results, k, baseline=plain, seed=opts.seed)
    m_o = compute_metrics(ort_results, k, baseline=plain, seed=opts.seed)
    counts = cmp.counts()
    same_tokens = all(a.output_ids == b.output_ids for a, b in zip(spec_results, ort_results))
    tau_equal = m_t["acceptance_length"] == m_o["acceptance_length"]
    greedy = opts.temperature <= 0
    passed = None
    if greedy:
        passed = (same_tokens and counts["mismatches"] == counts["near_tie_mismatches"]
                  and (counts["near_tie_mismatches"] > 0 or tau_equal))

    def side(m: dict) -> dict:
        return {key: m.get(key) for key in ("acceptance_length", "acceptance_at_pos", "num_drafts",
                                            "num_accepted_tokens", "tpot_ms", "draft_ms")}

    return {"graph": str(ort.path), "graph_dtype": ort.graph_dtype, "torch": side(m_t), "onnx": side(m_o),
            "drafts": counts, "tokens_identical": same_tokens, "tau_equal": tau_equal, "passed": passed,
            "timing_note": "onnx.draft_ms / tpot_ms include the per-step torch comparison; "
                           "drafts.primary_draft_ms_median is ONNX Runtime alone",
            "rule": "greedy: tokens identical, drafts identical outside near-ties (torch top-1/top-2 "
                    f"margin < {NEAR_TIE_MARGIN}), tau equal when no near-tie difference"}


def apply_onnx_gate(report) -> None:
    """Add the ``onnx`` result to ``report.gates`` / ``report.passed`` (greedy only)."""
    res = report.extra("onnx")
    if not res or res.get("passed") is None:
        return
    report.gates = {**(report.gates or {}), "onnx": bool(res["passed"])}
    report.passed = bool(report.passed) and bool(res["passed"])
