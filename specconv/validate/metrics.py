"""Acceptance metrics in vLLM's convention (``docs/validate.md``, "Metrics") from loop step records
(``RequestResult`` objects or their dicts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engines.counts import metrics_from_counts


def _mean(xs: Sequence[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def counts_from_steps(accepted: Sequence[int], k_per_step: Sequence[int], k: int) -> dict:
    """vLLM's counters (``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``, ``accepted_per_pos[k]``)."""
    per_pos = [0] * k
    for a in accepted:
        for i in range(min(a, k)):
            per_pos[i] += 1
    return {"num_drafts": len(accepted), "num_draft_tokens": int(sum(k_per_step)),
            "num_accepted_tokens": int(sum(accepted)), "accepted_per_pos": per_pos}


def _draft_steps(req) -> list:
    return [s for s in _steps(req) if _get(s, "k") > 0]


def _steps(req) -> list:
    return req["steps"] if isinstance(req, dict) else req.steps


def _get(obj, name):
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def bootstrap_ci(requests: Sequence[Any], *, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> list[float] | None:
    """Percentile bootstrap ``[low, high]`` of pooled τ over resampled requests; None under 2 requests."""
    import numpy as np

    sums = np.array([sum(_get(s, "accepted") for s in _draft_steps(r)) for r in requests], dtype=float)
    cnts = np.array([len(_draft_steps(r)) for r in requests], dtype=float)
    n = len(sums)
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    s, c = sums[idx].sum(1), cnts[idx].sum(1)
    taus = np.where(c > 0, 1.0 + s / np.maximum(c, 1), 1.0)
    lo, hi = np.percentile(taus, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return [float(lo), float(hi)]


def _tpot_ms(requests: Sequence[Any]) -> float | None:
    tot_ms = sum(_get(r, "decode_ms") for r in requests)
    toks = sum(max(0, len(_get(r, "output_ids")) - 1) for r in requests)
    return tot_ms / toks if toks else None


def compute_metrics(requests: Sequence[Any], k: int, *, baseline: Sequence[Any] | None = None, n_boot: int = 1000,
                    seed: int = 0) -> dict:
    """The metrics of one run (``docs/validate.md``'s table, plus ``per_request``); ``k``: nominal drafts
    per step; ``baseline``: the k = 0 run of the same prompts (``tpot_ar_ms``, ``speedup``)."""
    acc = [_get(s, "accepted") for r in requests for s in _draft_steps(r)]
    ks = [_get(s, "k") for r in requests for s in _draft_steps(r)]
    m = metrics_from_counts(**counts_from_steps(acc, ks, k))
    hist = [sum(1 for a in acc if min(a, k) == i) for i in range(k + 1)]
    per_req = [_per_request(r) for r in requests]
    ci = bootstrap_ci(requests, n_boot=n_boot, seed=seed)
    m.update({
        "k": k, "tau_pooled": m["acceptance_length"],
        "tau_request_mean": _mean([p["tau"] for p in per_req if p["tau"] is not None]),
        "tau_ci95": ci, "tau_ci95_half_width": (ci[1] - ci[0]) / 2 if ci else None, "histogram": hist,
        "n_requests": len(requests), "n_output_tokens": sum(len(_get(r, "output_ids")) for r in requests),
        **_timings(requests, baseline), "per_request": per_req,
        "convention": "vLLM: tau = 1 + accepted/num_drafts (bonus included); "
        "a_t = tokens emitted per step - 1 (capped at stop token / max tokens)",
    })
    return m


def _per_request(r) -> dict:
    """One request's τ (None without drafts), drafts, output tokens, stop."""
    ds = _draft_steps(r)
    return {"prompt_id": _get(r, "prompt_id"),
            "tau": 1.0 + sum(_get(s, "accepted") for s in ds) / len(ds) if ds else None,
            "num_drafts": len(ds), "output_tokens": len(_get(r, "output_ids")), "stopped": bool(_get(r, "stopped"))}


def _timings(requests: Sequence[Any], baseline: Sequence[Any] | None) -> dict:
    """Mean draft / verify ms per step, TTFT, TPOT (spec and plain) and the speedup (ms)."""
    all_steps = [s for r in requests for s in _steps(r)]
    tpot = _tpot_ms(requests)
    tpot_ar = _tpot_ms(baseline) if baseline else None
    return {"draft_ms": _mean([_get(s, "draft_ms") for s in all_steps if _get(s, "k") > 0]),
            "verify_ms": _mean([_get(s, "verify_ms") for s in all_steps]),
            "ttft_ms": _mean([_get(r, "ttft_ms") for r in requests]), "tpot_ms": tpot, "tpot_ar_ms": tpot_ar,
            "speedup": (tpot_ar / tpot) if (tpot and tpot_ar) else None}


def calibration(requests: Sequence[Any], *, n_bins: int = 10) -> dict | None:
    """DSpark confidence-head calibration against conditional acceptance (None without confidences).

    Slot ``i`` is reached when ``i ≤ a_t`` and accepted when ``i < a_t`` (speculators' DSpark target
    ``1 − TV(q, p)``); ``cumprod_bias``: mean over slots of ``Π_{j≤i} conf_j − 1[a_t > i]``.
    """
    pairs: list[tuple[float, float]] = []
    bias: list[float] = []
    for r in requests:
        for s in _draft_steps(r):
            conf = _get(s, "confidence")
            if not conf:
                continue
            a = _get(s, "accepted_raw")
            k = _get(s, "k")
            prod = 1.0
            for i, c in enumerate(conf[:k]):
                prod *= c
                bias.append(prod - (1.0 if a > i else 0.0))
                if i <= a:
                    pairs.append((c, 1.0 if i < a else 0.0))
    if not pairs:
        return None
    n = len(pairs)
    bins, ece = _calibration_bins(pairs, n_bins)
    return {"n": n, "mean_abs_error": sum(abs(c - o) for c, o in pairs) / n,
            "mean_confidence": sum(c for c, _ in pairs) / n, "mean_observed": sum(o for _, o in pairs) / n,
            "ece": ece, "bins": bins, "cumprod_bias": _mean(bias)}


def _calibration_bins(pairs: list[tuple[float, float]], n_bins: int) -> tuple[list[dict], float]:
    """Equal-width confidence bins (the last includes 1.0) and the ECE Σ (n_bin / n)·|confidence − observed|."""
    n = len(pairs)
    bins, ece = [], 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        sel = [(c, o) for c, o in pairs if (lo <= c < hi) or (b == n_bins - 1 and c == 1.0)]
        if not sel:
            continue
        mc = sum(c for c, _ in sel) / len(sel)
        mo = sum(o for _, o in sel) / len(sel)
        ece += len(sel) / n * abs(mc - mo)
        bins.append({"lo": lo, "hi": hi, "n": len(sel), "mean_confidence": mc, "observed": mo})
    return bins, ece


def kl_rows(ref, test):
    """KL(p_ref ‖ p_test) per row of ``[rows, V]`` logits, nats, in float64 (float32 rounding alone gives
    ~1e-8, G2's fp32 tolerance); a ``-inf`` test logit where the reference has mass counts as ``-1e30``."""
    import torch

    lp_r = torch.log_softmax(ref.double(), -1)
    lp_t = torch.log_softmax(test.double(), -1)
    pr = lp_r.exp()
    lp_t = torch.where(torch.isfinite(lp_t), lp_t, torch.full_like(lp_t, -1e30))
    return torch.where(pr > 0, pr * (lp_r - lp_t), torch.zeros_like(pr)).sum(-1).clamp_min(0)


def summary(metrics: dict) -> dict:
    """The short summary recorded in ``specconv.json`` / shown to humans."""
    keys = ("acceptance_length", "tau_request_mean", "tau_ci95", "acceptance_rate", "acceptance_at_pos",
            "num_drafts", "n_requests", "tpot_ms", "tpot_ar_ms", "speedup")
    return {k: metrics.get(k) for k in keys}
