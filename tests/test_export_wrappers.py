"""Export wrappers (specconv.export.wrappers) vs the reference drafters, eager, CPU.

The wrapper of each algorithm must reproduce ``Drafter.forward_block`` bit for bit at
batch 1 (no padding), and each row of a left-padded batch of 2 or 4 must equal its
batch-1 result (same argmax; logits within 1e-6 relative to their magnitude: padding
changes the GEMM shapes, so the last ulp may differ) with nothing NaN.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file  # noqa: E402
from test_drafters import H, VT, make_dflash, make_peagle  # noqa: E402

from specconv.drafters import load_drafter  # noqa: E402
from specconv.export.wrappers import OUTPUT_CHOICES, batch_inputs, make_wrapper  # noqa: E402

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


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    """Tied-embedding verifier (like SmolLM2)."""
    d = tmp_path_factory.mktemp("verifier")
    g = torch.Generator().manual_seed(42)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": H,
                                               "num_hidden_layers": 6, "vocab_size": VT,
                                               "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": torch.randn(VT, H, generator=g), "model.norm.weight": torch.ones(H)},
              str(d / "model.safetensors"))
    return d


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
    return dict(zip(w.output_names, w(*batch_inputs(w.p, reqs))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrapper_equals_forward_block_bit_for_bit(name, tmp_path, verifier_dir):
    dr = make_case(name, tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=OUTPUT_CHOICES, top_k=3)
    for tok, aux in _requests(w.p.aux_width)[:2]:
        ref = dr.forward_block(tok[None], aux[None])
        out = _run(w, [(tok, aux)])
        assert out["draft_ids"].dtype == torch.int32
        assert torch.equal(out["draft_ids"][0].long(), ref.tokens)  # target ids, d2t applied
        assert torch.equal(out["logits"][0], ref.target_logits.float())
        lp = torch.log_softmax(ref.draft_logits.float(), -1).gather(-1, ref.draft_ids[:, None])[:, 0]
        assert torch.equal(out["draft_logprobs"][0], lp)
        assert torch.equal(out["topk_ids"][0, :, 0].long(), ref.tokens)
        if ref.confidence is not None:  # fp32 head; a [1, F] @ [F] vs [F] @ [F] reduction
            torch.testing.assert_close(out["confidence"][0], ref.confidence, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("batch", [2, 4])
def test_padded_batch_rows_equal_batch_one(name, batch, tmp_path, verifier_dir):
    dr = make_case(name, tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=OUTPUT_CHOICES, top_k=3)
    reqs = _requests(w.p.aux_width)[:batch]
    full = _run(w, reqs)
    for t in full.values():
        assert not torch.isnan(t.float()).any()
    for b, req in enumerate(reqs):
        one = _run(w, [req])
        assert torch.equal(full["draft_ids"][b], one["draft_ids"][0])
        ref, got = one["logits"][0], full["logits"][b]
        assert torch.equal(torch.isinf(ref), torch.isinf(got))
        fin = torch.isfinite(ref)
        scale = ref[fin].abs().max()
        assert (got[fin] - ref[fin]).abs().max() <= 1e-6 * scale


@pytest.mark.parametrize("name", ["dflash-swa-pruned", "dspark", "peagle-qwen3-pruned"])
def test_onnx_attention_path_matches_reference(name, tmp_path, verifier_dir):
    """What the exporter traces (torch.onnx.ops.attention) agrees with the eager formula."""
    dr = make_case(name, tmp_path, verifier_dir)
    ref_w = make_wrapper(dr, outputs=OUTPUT_CHOICES)
    onnx_w = make_wrapper(dr, outputs=OUTPUT_CHOICES, onnx_attention=True)
    reqs = _requests(ref_w.p.aux_width)
    a, b = _run(ref_w, reqs), _run(onnx_w, reqs)
    assert torch.equal(a["draft_ids"], b["draft_ids"])
    fin = torch.isfinite(a["logits"])
    assert (a["logits"][fin] - b["logits"][fin]).abs().max() < 1e-4


def test_sampling_noise_steers_the_pick(tmp_path, verifier_dir):
    """Gumbel-max: a large noise bump on one draft id makes it the pick (target ids out)."""
    dr = make_case("dspark", tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=("ids", "logprobs"), sampling_noise=True)
    inputs = list(batch_inputs(w.p, _requests(w.p.aux_width)[:1], sampling_noise=True))
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
