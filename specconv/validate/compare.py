"""One drafter, several engines, the same prompts: per-position acceptance side by side and which engine
departs from the reference, where, and the likeliest cause (``docs/validate.md``, "Comparing engines").

Counts are per request (:class:`RequestCounts`); the verdict uses only drafting steps and accepted counts:
``a_0`` = drafting steps, ``a_i`` = steps with at least ``i`` drafts accepted, ``c_i = a_i / a_(i-1)``.
The draft accounting: draft-token counts are not used (vLLM counts ``k`` for a final step cut short by
``max_tokens``), and a drafting step counts only when it was verified: ``a_0`` is at most the steps the
output can hold, ``output tokens − 1 − accepted`` (every verified step emits its accepted drafts plus one
token; the first token comes from the prefill), so a draft an engine proposes after the last token
(vLLM-CPU counted 2–6 such per 145, docs/validate.md) is not a rejection. Uncertainty: a paired cluster
bootstrap over prompts (one resample of prompt ids per replicate, shared by every engine and the
reference), simultaneous 95 % intervals over the judged positions and τ by Bonferroni. numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["C_MARGIN", "CAUSES", "MIN_REACH", "EngineVerdict", "RequestCounts", "compare_engines", "tau_margin",
           "write_counts_jsonl"]

#: |Δc_i| an engine may differ from the reference at a position and still agree (absolute, 0..1).
C_MARGIN = 0.05
#: the fewest steps reaching a position (``a_(i-1)``, reference and engine) for it to be judged.
MIN_REACH = 30
#: what each cause means (the report and ``docs/validate.md`` carry the same words).
CAUSES = {
    "not_lossless": "the engine's greedy outputs differ from the plain verifier's (G4 failed): it is not "
                    "verifying the drafts it counts",
    "inflated_counts": "acceptance above the reference: the engine counts tokens the reference would reject "
                       "(a different accounting, or counters not earned by verification)",
    "slot_shift": "the curve is the reference's shifted by one position (c1 collapses to the reference's c2): "
                  "the drafter's layout is read one slot off (anchor / 1+N layout, sample_from_anchor)",
    "wrong_input": "c1 collapses without a shifted curve: the drafter gets a wrong input (aux-layer ids, "
                   "embeddings or LM head taken from the wrong place)",
    "cut_short": "no draft past some position is ever accepted: drafting cut short (num_speculative_tokens / "
                 "spec-draft-n-max smaller than the drafter's block)",
    "sequential_drafting": "c1 holds while later positions fall: the later drafts are not the drafter's "
                           "(sequential or re-anchored drafting, a truncated block)",
}


@dataclass(frozen=True)
class RequestCounts:
    """One request's speculative counts: ``num_drafts`` = drafting steps (a_0), ``accepted_per_pos[i-1]`` =
    steps with ≥ i drafts accepted (a_i), ``num_draft_tokens`` / ``num_accepted_tokens`` as the engine counts."""

    prompt_id: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    output_tokens: int | None = None

    @property
    def verified_steps(self) -> int:
        """a_0: ``num_drafts``, at most ``output_tokens − 1 − num_accepted_tokens`` when the output length is known
        (never below ``a_1``: an engine reporting more accepted tokens than it emitted keeps its own a_0)."""
        if self.output_tokens is None:
            return self.num_drafts
        cap = self.output_tokens - 1 - self.num_accepted_tokens
        a1 = self.accepted_per_pos[0] if self.accepted_per_pos else 0
        return min(self.num_drafts, cap) if cap >= a1 else self.num_drafts

    @classmethod
    def from_mapping(cls, prompt_id: str, d: Mapping[str, Any], output_tokens: int | None = None) -> RequestCounts:
        """From a counter difference (``specconv.engines.served.diff_counters``: floats) or
        ``counts_from_steps`` (ints); ``output_tokens``: the request's output length (else ``d``'s, if any)."""
        per = d.get("accepted_per_pos") or []
        out = output_tokens if output_tokens is not None else d.get("output_tokens")
        return cls(prompt_id, round(float(d["num_drafts"])), round(float(d["num_draft_tokens"])),
                   round(float(d["num_accepted_tokens"])), tuple(round(float(x)) for x in per),
                   None if out is None else int(out))


def tau_margin(tau_reference: float) -> float:
    """The τ margin: today's τ band, max(0.05, 2 % of the reference's τ)."""
    return max(0.05, 0.02 * tau_reference)


@dataclass
class EngineVerdict:
    """One engine against the reference: ``verdict`` ``agrees`` / ``departs`` / ``inconclusive``; ``position``
    (1-based) where it departs (None: τ only, or not departing); ``cause`` a key of :data:`CAUSES`;
    ``delta_c`` / ``delta_c_ci`` per judged position, ``delta_tau`` / ``delta_tau_ci``; ``c`` / ``tau`` the
    engine's point values; ``judged`` the positions judged (1-based)."""

    engine: str
    verdict: str
    position: int | None
    direction: str | None
    cause: str | None
    tau: float
    tau_ci: tuple[float, float]
    c: list[float | None]
    delta_c: list[float | None]
    delta_c_ci: list[tuple[float, float] | None]
    delta_tau: float
    delta_tau_ci: tuple[float, float]
    judged: list[int]
    reason: str
    n_prompts: int
    num_drafts: int
    margins: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready (tuples as lists)."""
        return json.loads(json.dumps(asdict(self)))


def _matrix(counts: Sequence[RequestCounts], ids: Sequence[str], k: int) -> np.ndarray:
    """``[n_prompts, k+1]``: a_0..a_k per prompt in ``ids`` order."""
    by = {r.prompt_id: r for r in counts}
    out = np.zeros((len(ids), k + 1))
    for n, pid in enumerate(ids):
        r = by[pid]
        out[n, 0] = r.verified_steps
        per = list(r.accepted_per_pos)[:k]
        out[n, 1 : 1 + len(per)] = per
    return out


def _stats(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Summed ``a [..., n, k+1]`` → (c ``[..., k]`` NaN where a_(i-1) = 0, τ ``[...]`` = 1 + Σ_i a_i / a_0)."""
    s = a.sum(axis=-2)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(s[..., :-1] > 0, s[..., 1:] / np.where(s[..., :-1] > 0, s[..., :-1], 1), np.nan)
        tau = np.where(s[..., 0] > 0, 1.0 + s[..., 1:].sum(-1) / np.where(s[..., 0] > 0, s[..., 0], 1), 1.0)
    return c, tau


def _interval(x: np.ndarray, alpha: float) -> tuple[float, float] | None:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return None
    lo, hi = np.quantile(x, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def compare_engines(reference: Sequence[RequestCounts], engines: Mapping[str, Sequence[RequestCounts]], *,
                    lossless: Mapping[str, bool | None] | None = None,
                    paired: Mapping[str, set[str]] | None = None, n_boot: int = 4000, seed: int = 0,
                    level: float = 0.95, c_margin: float = C_MARGIN, min_reach: int = MIN_REACH,
                    ) -> list[EngineVerdict]:
    """Every engine's verdict against ``reference`` on the prompts all of them answered.

    Args:
        reference: per-request counts of specconv's loop (or any reference run).
        engines: engine name → its per-request counts of the same prompts.
        lossless: engine name → its G4 result (False: ``departs``, cause ``not_lossless``).
        paired: engine name → the prompts whose output equals the reference's token for token (others
            weigh nothing on either side: acceptance is compared on the same text only; default all).
        n_boot: bootstrap replicates (4000: the Bonferroni tails keep ≥ 15 replicates each at 8 positions).

    Returns:
        One :class:`EngineVerdict` per engine, in ``engines`` order.

    Raises:
        ValueError: an engine lacks a prompt the reference has (compare on the same prompts only).
    """
    ids = [r.prompt_id for r in reference]
    k = max([len(r.accepted_per_pos) for r in reference]
            + [len(r.accepted_per_pos) for rs in engines.values() for r in rs] + [1])
    for name, rs in engines.items():
        missing = sorted(set(ids) - {r.prompt_id for r in rs})
        if missing:
            raise ValueError(f"{name} has no counts for {len(missing)} prompt(s): {', '.join(missing[:3])}")
    ref_all = _matrix(reference, ids, k)
    idx = np.random.default_rng(seed).integers(0, len(ids), size=(n_boot, len(ids)))
    out = []
    for name, rs in engines.items():
        keep = np.array([[1.0] if same is None or pid in same else [0.0]
                         for pid in ids for same in [(paired or {}).get(name)]])
        eng, ref = _matrix(rs, ids, k) * keep, ref_all * keep  # prompts outside ``paired`` weigh nothing
        ref_c, ref_tau = _stats(ref)
        boot_ref_c, boot_ref_tau = _stats(ref[idx])
        v = _judge(name, eng, ref, ref_c, float(ref_tau), boot_ref_c, boot_ref_tau, idx, level, c_margin,
                   min_reach, (lossless or {}).get(name))
        v.n_prompts = int(keep.sum())
        out.append(v)
    return out


def _judge(name: str, eng: np.ndarray, ref: np.ndarray, ref_c: np.ndarray, ref_tau: float, boot_ref_c: np.ndarray,
           boot_ref_tau: np.ndarray, idx: np.ndarray, level: float, c_margin: float, min_reach: int,
           lossless: bool | None) -> EngineVerdict:
    """One engine's intervals and verdict (see :func:`compare_engines`)."""
    k = eng.shape[1] - 1
    c, tau = _stats(eng)
    boot_c, boot_tau = _stats(eng[idx])
    reach_e, reach_r = eng.sum(0)[:-1], ref.sum(0)[:-1]
    judged = [i + 1 for i in range(k) if min(reach_e[i], reach_r[i]) >= min_reach]
    alpha = (1 - level) / (len(judged) + 1)  # Bonferroni over the judged positions and τ
    d_ci: list[tuple[float, float] | None] = [None] * k
    for i in judged:
        d_ci[i - 1] = _interval(boot_c[:, i - 1] - boot_ref_c[:, i - 1], alpha)
    tau_ci = _interval(boot_tau - boot_ref_tau, alpha) or (0.0, 0.0)
    t_margin = tau_margin(ref_tau)
    delta = [None if not (np.isfinite(c[i]) and np.isfinite(ref_c[i])) else float(c[i] - ref_c[i]) for i in range(k)]
    position, direction, reason = None, None, ""
    for i in judged:
        lo_hi = d_ci[i - 1]
        if lo_hi is not None and (lo_hi[0] > c_margin or lo_hi[1] < -c_margin):
            position, direction = i, "above" if lo_hi[0] > c_margin else "below"
            reason = f"Δc{i} interval [{lo_hi[0]:+.3f}, {lo_hi[1]:+.3f}] lies outside ±{c_margin}"
            break
    tau_out = tau_ci[0] > t_margin or tau_ci[1] < -t_margin
    if position is None and tau_out:
        direction = "above" if tau_ci[0] > t_margin else "below"
        reason = f"Δτ interval [{tau_ci[0]:+.3f}, {tau_ci[1]:+.3f}] lies outside ±{t_margin:.3f}"
    inside = all(_within(d_ci[i - 1], c_margin) for i in judged) and _within(tau_ci, t_margin)
    if lossless is False:  # G4 failed: whatever the counts say, it does not serve the verifier's outputs
        verdict, cause = "departs", "not_lossless"
        reason = "its greedy outputs are not the verifier's (G4)" + (f"; {reason}" if reason else "")
    elif position is not None or tau_out:
        verdict = "departs"
        cause = _cause(position, direction, c, ref_c, eng, ref, judged, c_margin)
    elif 1 in judged and inside:
        verdict, cause, reason = "agrees", None, f"every judged interval lies within ±{c_margin} (Δc) and " \
                                                 f"±{t_margin:.3f} (Δτ)"
    else:
        verdict, cause = "inconclusive", None
        reason = ("too few drafting steps reach position 1" if 1 not in judged
                  else "an interval straddles the margin: more prompts or tokens would decide")
    return EngineVerdict(
        engine=name, verdict=verdict, position=position, direction=direction, cause=cause, tau=float(tau),
        tau_ci=_interval(boot_tau, 1 - level) or (float(tau), float(tau)),
        c=[float(x) if np.isfinite(x) else None for x in c], delta_c=delta, delta_c_ci=d_ci,
        delta_tau=float(tau - ref_tau), delta_tau_ci=tau_ci, judged=judged, reason=reason, n_prompts=eng.shape[0],
        num_drafts=int(eng[:, 0].sum()), margins={"c": c_margin, "tau": t_margin, "level": level})


def _within(ci: tuple[float, float] | None, margin: float) -> bool:
    return ci is not None and -margin <= ci[0] and ci[1] <= margin


def _cause(position: int | None, direction: str | None, c: np.ndarray, ref_c: np.ndarray, eng: np.ndarray,
           ref: np.ndarray, judged: Sequence[int], c_margin: float) -> str:
    """The likeliest cause of a departure in the counts (a key of :data:`CAUSES`; a failed G4 is decided
    before), checked in this order: above the reference; at position 1: the curve shifted by one, else a
    wrong input; later: nothing accepted from the departing position on while the reference accepts there,
    else sequential drafting."""
    if direction == "above":
        return "inflated_counts"
    if position in (None, 1):
        pairs = [(c[i - 1], ref_c[i]) for i in judged if i < len(ref_c) and np.isfinite(ref_c[i])][:2]
        # c1 lands on the reference's c2 (within the margin), and c2 on its c3 when judged (twice the
        # margin: fewer steps reach it)
        if pairs and all(np.isfinite(e) and abs(e - r) <= c_margin * (1 + n) for n, (e, r) in enumerate(pairs)):
            return "slot_shift"
        return "wrong_input"
    s_e, s_r = eng.sum(0), ref.sum(0)
    if s_e[position:].sum() == 0 and s_r[position] > 0:
        return "cut_short"
    return "sequential_drafting"


def write_counts_jsonl(path: Path, runs: Mapping[str, Sequence[RequestCounts]]) -> Path:
    """One JSON line per (engine, request): ``{engine, prompt_id, num_drafts, num_draft_tokens,
    num_accepted_tokens, accepted_per_pos}`` (the counts every verdict is computed from)."""
    with path.open("w") as fh:
        for name, rs in runs.items():
            for r in rs:
                fh.write(json.dumps({"engine": name, **asdict(r)}) + "\n")
    return path
