"""The export wrapper (specconv.engines.onnx.wrappers) over the drafters' one step, eager, CPU.

The wrapper runs the drafter's own ``step`` (the same code ``forward_block`` runs), so it
is not compared with ``forward_block`` here: that would compare the code with itself. The
independent oracles are elsewhere — ONNX Runtime on the exported graph
(``tests/test_export_onnx.py``), speculators' and z-lab's forwards
(``tests/drafters/test_drafters_parity.py``), speculators' mask functions
(``tests/drafters/test_step_masks.py``). What is checked here is what only the batched,
padded form can get wrong: each row of a left-padded batch of 2 or 4 reproduces its
batch-1 result with nothing NaN (padding changes the GEMM shapes, so floats agree within
the fp32 tolerance and ids exactly except at near-ties, ``tests/tolerances.py``; never bit
for bit, which differs between CPUs), the ONNX attention op agrees with the eager formula
under the step's masks, the outputs agree with each other, and sampling noise steers the
pick.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specconv.drafters import load_drafter  # noqa: E402
from specconv.drafters.step import batch_inputs  # noqa: E402
from specconv.engines.onnx.wrappers import OUTPUT_CHOICES, make_wrapper  # noqa: E402
from tests.drafters.test_drafters import (  # noqa: E402,F401  (another room: not on sys.path)
    VT,
    H,
    make_dflash,
    make_peagle,
)
from tests.tolerances import assert_close, assert_ids_match, assert_logits_match  # noqa: E402

CASES = {
    "dflash": dict(kind="dflash"),
    "dflash-swa-pruned": dict(kind="dflash", vd=20, layer_types=["sliding_attention", "full_attention"],
                              sliding_window=3),
    "dflash-sfa-noncausal": dict(kind="dflash", sfa=True, layer_types=["sliding_attention"] * 2,
                                 sliding_window=4, non_causal=True),
    "dspark": dict(kind="dspark", vd=20),
    "dspark-gated": dict(kind="dspark", head_type="gated", conf_markov=False),
    "peagle": dict(kind="peagle", K=4),
    "peagle-qwen3-pruned": dict(kind="peagle", K=3, vd=20, model_type="qwen3"),
}


def make_case(name: str, root, verifier_dir):
    kw = dict(CASES[name])
    kind = kw.pop("kind")
    d = root / name
    if kind == "peagle":
        make_peagle(d, **kw)
    else:
        make_dflash(d, algo=kind, **kw)
    return load_drafter(d, verifier_dir)


def _requests(width: int, lengths=(7, 3, 11, 5), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VT - 1, (T + 1,), generator=g), torch.randn(T, width, generator=g))
            for T in lengths]


def _run(w, reqs):
    return dict(zip(w.output_names, w(*batch_inputs(w.shape, reqs)), strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("batch", [2, 4])
def test_padded_batch_rows_equal_batch_one(name, batch, tmp_path, verifier_dir):
    dr = make_case(name, tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=OUTPUT_CHOICES, top_k=3)
    reqs = _requests(w.shape.aux_width)[:batch]
    full = _run(w, reqs)
    for t in full.values():
        assert not torch.isnan(t.float()).any()
    for b, req in enumerate(reqs):
        one = _run(w, [req])
        what = f"{name} batch {batch} row {b}"
        assert_logits_match(full["logits"][b], one["logits"][0], actual_ids=full["draft_ids"][b],
                            expected_ids=one["draft_ids"][0], what=what)
        assert_close(full["draft_logprobs"][b], one["draft_logprobs"][0], what=f"{what} draft_logprobs")
        if "confidence" in full:
            assert_close(full["confidence"][b], one["confidence"][0], what=f"{what} confidence")


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_agree_with_each_other(name, tmp_path, verifier_dir):
    """Target ids, top-k, log-probs and logits of one step tell the same story: the pick is the
    top-1 of the target logits (``-inf`` exactly outside a pruned draft vocabulary), its
    log-prob is the log-softmax there, the top-k ids are target ids in logit order."""
    dr = make_case(name, tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=OUTPUT_CHOICES, top_k=3)
    out = _run(w, _requests(w.shape.aux_width)[:2])
    logits = out["logits"]
    assert out["draft_ids"].dtype == torch.int32 and logits.shape[-1] == VT
    assert torch.isfinite(logits).sum(-1).eq(dr.draft_vocab_size).all()
    assert_ids_match(out["draft_ids"], logits.argmax(-1), logits, what=f"{name} ids vs logits")
    assert torch.equal(out["topk_ids"][..., 0], out["draft_ids"])
    lp = torch.log_softmax(logits, -1)
    assert_close(out["draft_logprobs"], lp.gather(-1, out["draft_ids"].long()[..., None])[..., 0],
                 what=f"{name} draft_logprobs")
    assert_close(out["topk_logprobs"], lp.gather(-1, out["topk_ids"].long()), what=f"{name} topk_logprobs")
    if dr.alg.export.confidence_output and dr.confidence_proj is not None:
        assert ((out["confidence"] > 0) & (out["confidence"] < 1)).all()
    else:
        assert "confidence" not in out


@pytest.mark.parametrize("name", ["dflash-swa-pruned", "dspark", "peagle-qwen3-pruned"])
def test_onnx_attention_path_matches_reference(name, tmp_path, verifier_dir):
    """What the exporter traces (torch.onnx.ops.attention) agrees with the eager formula."""
    dr = make_case(name, tmp_path, verifier_dir)
    ref_w = make_wrapper(dr, outputs=OUTPUT_CHOICES)
    onnx_w = make_wrapper(dr, outputs=OUTPUT_CHOICES, onnx_attention=True)
    reqs = _requests(ref_w.shape.aux_width)
    a, b = _run(ref_w, reqs), _run(onnx_w, reqs)
    assert_logits_match(b["logits"], a["logits"], actual_ids=b["draft_ids"], expected_ids=a["draft_ids"],
                        what=f"{name} onnx attention")


def test_sampling_noise_steers_the_pick(tmp_path, verifier_dir):
    """Gumbel-max: a large noise bump on one draft id makes it the pick (target ids out)."""
    dr = make_case("dspark", tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=("ids", "logprobs"), sampling_noise=True)
    inputs = list(batch_inputs(w.shape, _requests(w.shape.aux_width)[:1], sampling_noise=True))
    greedy = w(*inputs)[0]
    noise = inputs[-1]
    noise[0, :, 5] = 1e4
    steered = w(*inputs)[0]
    d2t = dr.vocab.draft_to_target
    assert (steered[0].long() == d2t[5]).all()
    assert not torch.equal(greedy, steered)


def test_peagle_single_depth_is_refused(tmp_path, verifier_dir):
    from specconv.errors import UnsupportedFormatError

    d = make_peagle(tmp_path / "k1", K=1)
    with pytest.raises(UnsupportedFormatError, match="at least 2 depths"):
        make_wrapper(load_drafter(d, verifier_dir))
