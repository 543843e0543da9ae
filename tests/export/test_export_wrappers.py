"""Export wrappers (specconv.export.wrappers) vs the reference drafters, eager, CPU.

The wrapper of each algorithm must reproduce ``Drafter.forward_block`` at batch 1 (no
padding), and each row of a left-padded batch of 2 or 4 must reproduce its batch-1 result
with nothing NaN. The wrapper is a second compute path (batched GEMMs, its own attention
formula; padding changes the GEMM shapes), so floats agree within the fp32 tolerance and
ids exactly except at near-ties (``tests/tolerances.py``); never bit for bit, which differs
between CPUs (an AMD EPYC failed it).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file  # noqa: E402
from test_drafters import H, VT, make_dflash, make_peagle  # noqa: E402

from specconv.drafters import load_drafter  # noqa: E402
from specconv.export.wrappers import OUTPUT_CHOICES, batch_inputs, make_wrapper  # noqa: E402
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
def test_wrapper_matches_forward_block(name, tmp_path, verifier_dir):
    dr = make_case(name, tmp_path, verifier_dir)
    w = make_wrapper(dr, outputs=OUTPUT_CHOICES, top_k=3)
    for i, (tok, aux) in enumerate(_requests(w.p.aux_width)[:2]):
        what = f"{name} request {i}"
        ref = dr.forward_block(tok[None], aux[None])
        out = _run(w, [(tok, aux)])
        assert out["draft_ids"].dtype == torch.int32
        target = ref.target_logits.float()
        # target ids (d2t applied); the -inf outside a pruned draft vocab must match exactly
        assert_logits_match(out["logits"][0], target, actual_ids=out["draft_ids"][0],
                            expected_ids=ref.tokens, what=f"{what} logits / draft_ids")
        assert_ids_match(out["topk_ids"][0, :, 0], ref.tokens, target, what=f"{what} top-1 of topk_ids")
        lp = torch.log_softmax(ref.draft_logits.float(), -1).gather(-1, ref.draft_ids[:, None])[:, 0]
        assert_close(out["draft_logprobs"][0], lp, what=f"{what} draft_logprobs")
        if ref.confidence is not None:
            assert_close(out["confidence"][0], ref.confidence, what=f"{what} confidence")


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
        assert_logits_match(full["logits"][b], one["logits"][0], actual_ids=full["draft_ids"][b],
                            expected_ids=one["draft_ids"][0], what=f"{name} batch {batch} row {b}")


@pytest.mark.parametrize("name", ["dflash-swa-pruned", "dspark", "peagle-qwen3-pruned"])
def test_onnx_attention_path_matches_reference(name, tmp_path, verifier_dir):
    """What the exporter traces (torch.onnx.ops.attention) agrees with the eager formula."""
    dr = make_case(name, tmp_path, verifier_dir)
    ref_w = make_wrapper(dr, outputs=OUTPUT_CHOICES)
    onnx_w = make_wrapper(dr, outputs=OUTPUT_CHOICES, onnx_attention=True)
    reqs = _requests(ref_w.p.aux_width)
    a, b = _run(ref_w, reqs), _run(onnx_w, reqs)
    assert_logits_match(b["logits"], a["logits"], actual_ids=b["draft_ids"], expected_ids=a["draft_ids"],
                        what=f"{name} onnx attention")


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
