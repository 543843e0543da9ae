"""``specconv validate DIR --engine PATH``: the acceptance loop with a TensorRT engine drafting.

Runs the same requests as the torch speculative run with
:class:`~.engine_drafter.EngineDrafter` as the drafter, each greedy step also compared
with the torch drafter on the same inputs (top-1 agreement; KL(torch ‖ engine) of the
draft distributions where the graph outputs logits). The ``engine`` gate: τ within 3 %
of the torch run's τ (issue 9; docs/engines.md).
"""

from __future__ import annotations

import torch

from .ort_drafter import ComparingDrafter
from .ort_validate import NEAR_TIE_MARGIN

__all__ = ["engine_acceptance", "apply_engine_gate", "TAU_REL_TOL", "KlComparingDrafter", "kl_rows"]

TAU_REL_TOL = 0.03


def kl_rows(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref) ‖ softmax(logits)) per row, nats; ``-inf`` entries (pruned vocab)
    contribute 0 where the reference has no mass and ``inf`` where only it has.

    Args:
        ref_logits, logits: ``[k, V]`` float.

    Returns:
        ``[k]`` float32.
    """
    lp = torch.log_softmax(ref_logits.float(), dim=-1)
    lq = torch.log_softmax(logits.float().to(lp.device), dim=-1)
    p = lp.exp()
    terms = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))
    return terms.sum(dim=-1)


class KlComparingDrafter(ComparingDrafter):
    """:class:`ComparingDrafter` that also accumulates the per-draft KL when both sides
    return logits of the same shape."""

    def __init__(self, primary, reference, *, margin: float = NEAR_TIE_MARGIN):
        super().__init__(primary, reference, margin=margin)
        self.kl: list[float] = []

    def propose(self, context_tokens, aux_hidden, *, temperature: float = 0.0, generator=None):
        prop = super().propose(context_tokens, aux_hidden, temperature=temperature, generator=generator)
        if temperature <= 0 and prop.logits is not None:
            ref = self.last_reference
            if ref.logits is not None and tuple(ref.logits.shape) == tuple(prop.logits.shape):
                self.kl.extend(kl_rows(ref.logits, prop.logits).cpu().tolist())
        return prop

    def counts(self) -> dict:
        c = super().counts()
        c["top1_agreement"] = 1.0 - c["mismatches"] / c["drafts"] if c["drafts"] else None
        finite = [x for x in self.kl if x == x]
        c["kl_mean"] = sum(finite) / len(finite) if finite else None
        c["kl_max"] = max(finite) if finite else None
        return c


def engine_acceptance(engine_path: str, drafter_dir, drafter, run, spec_results, plain, k: int, opts) -> dict:
    """Run the engine-drafted loop and compare it with the torch run.

    Args:
        engine_path: ``--engine`` PATH.
        drafter_dir: the Speculators dir (the engine must be built from it).
        drafter: the torch reference drafter (already loaded).
        run: ``run(name, drafter)`` of the torch backend's harness.
        spec_results, plain: the torch speculative and plain-decode request results.
        k: drafts per step.
        opts: the validate options (``seed``).

    Returns:
        ``{"engine", "build", "torch": {...}, "engine_run": {...}, "drafts": counts,
        "tau_rel_diff", "passed", "rule"}``.
    """
    from ..validate.metrics import compute_metrics
    from .engine_drafter import EngineDrafter

    eng = EngineDrafter(engine_path, drafter_dir)
    cmp = KlComparingDrafter(eng, drafter)
    eng_results = run("speculative decode (TensorRT engine drafter)", cmp)
    m_t = compute_metrics(spec_results, k, baseline=plain, seed=opts.seed)
    m_e = compute_metrics(eng_results, k, baseline=plain, seed=opts.seed)
    tau_t, tau_e = float(m_t["acceptance_length"]), float(m_e["acceptance_length"])
    rel = abs(tau_e - tau_t) / tau_t if tau_t else float("inf")

    def side(m: dict) -> dict:
        return {key: m.get(key) for key in ("acceptance_length", "acceptance_at_pos", "num_drafts",
                                            "num_accepted_tokens", "tpot_ms", "draft_ms")}

    return {"engine": str(eng.path), "build": {x: eng.build.get(x) for x in (
                "key", "builder", "trt_version", "compute_capability", "dtype", "hardware_compat",
                "version_compatible")},
            "torch": side(m_t), "engine_run": side(m_e), "drafts": cmp.counts(), "tau_rel_diff": rel,
            "passed": bool(rel <= TAU_REL_TOL),
            "rule": f"tau within {TAU_REL_TOL:.0%} of the torch run; top-1 agreement and KL reported"}


def apply_engine_gate(report) -> None:
    """Add the ``engine`` result to ``report.gates`` / ``report.passed``."""
    res = report.extra("engine")
    if not res or res.get("passed") is None:
        return
    report.gates = {**(report.gates or {}), "engine": bool(res["passed"])}
    report.passed = bool(report.passed) and bool(res["passed"])
