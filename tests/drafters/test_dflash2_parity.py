"""DFlash2 reference drafter against the two peer implementations on the same weights (fp32, CPU).

* z-lab ``dflash`` 0.1.0 ``DFlash2DraftModel``: built from a Qwen3 config (``../shared/reference/dflash2.md`` §5),
  saved with ``save_pretrained`` (codebooks named ``….codebook.weight``), turned into a Speculators ``dflash2``
  dir by hand (bare codebook names, aux ids + 1); compared through its ``forward`` and
  ``candidate_selector.select`` (the selector's greedy walk from the anchor).
* speculators 0.9.0 ``DFlash2DraftModel`` (``from_training_args``, saved with ``save_pretrained``): its training
  backbone on one fixed anchor and its ``candidate_selector`` walk.

Gate: G2's fp32 row through ``tests/tolerances.py``; the drafted path must be identical (scores in fp32, no
near-ties at these scales: the test asserts the margin it relies on).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.peer

pytest.importorskip("speculators")
pytest.importorskip("dflash")
pytest.importorskip("loguru")

from safetensors.torch import load_file, save_file  # noqa: E402

from specconv.drafters import load_drafter  # noqa: E402
from tests.drafters import test_drafters_parity as peers  # noqa: E402
from tests.tolerances import assert_close, assert_logits_match  # noqa: E402

H, VOCAB, MASK, B, K, R = peers.H, peers.VOCAB, peers.MASK, 8, 4, 8
DFLASH2_KEYS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": R, "selector_top_k": K}


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3 verifier of the other parity tests (6 layers, vocab 256)."""
    return peers.verifier_dir.__wrapped__(tmp_path_factory)


def _zlab_model(seed: int = 0):
    from dflash.model import DFlash2DraftModel

    cfg = peers._qwen3_cfg(num_hidden_layers=2, layer_types=["full_attention"] * 2, num_target_layers=6,
                           is_causal=False,
                           dflash_config={"block_size": B, "mask_token_id": MASK, "target_layer_ids": [0, 2, 4],
                                          **DFLASH2_KEYS})
    cfg.architectures = ["DFlash2DraftModel"]
    torch.manual_seed(seed)
    model = DFlash2DraftModel(cfg)
    peers._randomise(model)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # z-lab leaves base_kernel uninitialised (dflash2.md pitfall 12): identity + noise
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.copy_(0.2 * torch.randn(conv.base_kernel.shape, generator=g))
                conv.base_kernel[:, 0] += 1.0
        sel = model.candidate_selector  # a selector strong enough to reorder the top-K
        sel.predecessor_codebook.weight.normal_(0, 2.0, generator=g)
        sel.successor_codebook.weight.normal_(0, 2.0, generator=g)
    return model.eval()


def _to_speculators(zdir: Path, out: Path, verifier_dir: Path) -> None:
    """A Speculators ``dflash2`` dir by hand (dflash2.md §2.3): the converter's job, kept independent here."""
    zc = json.loads((zdir / "config.json").read_text())
    dc = zc["dflash_config"]
    drop = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers", "is_causal", "dtype",
            "torch_dtype", "transformers_version")
    tl = {k: v for k, v in zc.items() if k not in drop} | {"model_type": "qwen3", "tie_word_embeddings": False}
    vcfg = json.loads((verifier_dir / "config.json").read_text())
    cfg = {"speculators_model_type": "dflash2", "speculators_version": "0.9.0", "architectures": ["DFlash2DraftModel"],
           "draft_vocab_size": zc["vocab_size"], "aux_hidden_state_layer_ids": [i + 1 for i in dc["target_layer_ids"]],
           "mask_token_id": dc["mask_token_id"], "block_size": dc["block_size"], "sample_from_anchor": False,
           "sliding_window_non_causal": True, **{k: dc[k] for k in DFLASH2_KEYS}, "transformer_layer_config": tl,
           "speculators_config": {
               "algorithm": "dflash2", "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": dc["block_size"] - 1,
                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
               "verifier": {"name_or_path": "local/tiny-verifier", "architectures": vcfg.get("architectures", [])}}}
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tensors = load_file(str(zdir / "model.safetensors"))
    save_file({k.removesuffix(".weight") if "_codebook" in k else k: v for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})


def _zlab_step(model, verifier_dir: Path, hs: torch.Tensor, ids: torch.Tensor, a: int):
    """z-lab's hidden ``[B, H]``, logits ``[B, V]`` and selector path ``[B-1]`` for anchor ``ids[a]``."""
    vw = load_file(str(verifier_dir / "model.safetensors"))
    embed, head = vw["model.embed_tokens.weight"], vw["lm_head.weight"]
    block = torch.full((1, B), MASK)
    block[0, 0] = ids[0, a]
    with torch.no_grad():
        h = model(target_hidden=hs[:, :a], noise_embedding=embed[block], position_ids=torch.arange(a + B)[None])
        logits = h @ head.T
        path, _, _ = model.candidate_selector.select(h[:, 1:], logits[:, 1:], block[:, 0], 0.0)
    return h[0], logits[0], path[0]


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_dflash2_matches_zlab(seed, verifier_dir, tmp_path):
    """Hidden states, unary logits and the greedy selector path equal z-lab's; on these weights the selector
    moves at least one draft away from the per-slot argmax (dflash2.md §5 run 3)."""
    zmodel = _zlab_model(seed)
    zdir, sdir = tmp_path / "zlab", tmp_path / "spec"
    zmodel.save_pretrained(zdir)
    assert any(k.endswith("_codebook.weight") for k in load_file(str(zdir / "model.safetensors")))
    _to_speculators(zdir, sdir, verifier_dir)
    drafter = load_drafter(sdir, verifier_dir)
    assert drafter.aux_layer_ids == [1, 3, 5] and drafter.num_draft_tokens == B - 1

    hs, ids = peers._features(T=12, A=3, seed=3 + seed)
    a = 11
    zh, zlogits, zpath = _zlab_step(zmodel, verifier_dir, hs, ids, a)
    out = drafter.forward_block(ids[:, : a + 1], hs[:, :a])
    assert_close(out.hidden, zh, what=f"zlab dflash2 seed {seed} hidden")
    assert_logits_match(out.slot_logits, zlogits, what=f"zlab dflash2 seed {seed} logits")
    assert out.tokens.tolist() == zpath.tolist()
    finite = torch.isfinite(out.draft_logits)
    assert finite.sum(-1).eq(K).all()  # the selector's q lives on the K candidates only


@pytest.mark.slow
def test_dflash2_selector_changes_the_greedy_draft(verifier_dir, tmp_path):
    """At temperature 0 the walk is not the per-slot argmax: on these weights some slot differs, and
    zeroing the predecessor codebook gives the argmax back (the bilinear term is what reorders)."""
    zmodel = _zlab_model(0)
    zdir, sdir = tmp_path / "zlab", tmp_path / "spec"
    zmodel.save_pretrained(zdir)
    _to_speculators(zdir, sdir, verifier_dir)
    drafter = load_drafter(sdir, verifier_dir)
    hs, ids = peers._features(T=12, A=3, seed=3)
    out = drafter.forward_block(ids[:, :12], hs[:, :11])
    argmax = out.slot_logits[1:].argmax(-1)
    assert out.tokens.tolist() != argmax.tolist()
    with torch.no_grad():
        drafter.predecessor_codebook.zero_()
    plain = drafter.forward_block(ids[:, :12], hs[:, :11])
    assert plain.tokens.tolist() == argmax.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("layers", [("full_attention",) * 2, ("sliding_attention", "full_attention")],
                         ids=["full", "mixed"])
def test_dflash2_matches_speculators(layers, verifier_dir, tmp_path, monkeypatch):
    """speculators' own save loads; its backbone on one anchor and a greedy walk with its ``CandidateSelector``
    give the hidden states, logits and drafts of specconv's drafter."""
    from speculators.models import DFlash2DraftModel

    swa = "sliding_attention" in layers
    cfg = peers._qwen3_cfg(num_hidden_layers=2, layer_types=list(layers), sliding_window=3 if swa else None,
                           use_sliding_window=swa)
    model = DFlash2DraftModel.from_training_args(
        cfg, verifier_name_or_path=str(verifier_dir), draft_vocab_size=VOCAB, block_size=B,
        target_layer_ids=[1, 3, 6], mask_token_id=MASK, draft_attn_impl="eager", **DFLASH2_KEYS)
    peers._randomise(model, skip=("embed_tokens", "lm_head"))
    with torch.no_grad():
        model.candidate_selector.predecessor_codebook.normal_(0, 2.0)
        model.candidate_selector.successor_codebook.normal_(0, 2.0)
    model.eval()
    out_dir = tmp_path / "spec"
    model.save_pretrained(out_dir)
    saved = json.loads((out_dir / "config.json").read_text())
    assert saved["speculators_model_type"] == "dflash2" and saved["selector_top_k"] == K
    drafter = load_drafter(out_dir, verifier_dir)

    hs, ids = peers._features(T=20, A=3)
    anchor = 9  # context 0..8: the SWA window (3) binds
    ref = peers._speculators_block(model, monkeypatch, hs, ids, anchor)
    out = drafter.forward_block(ids[:, : anchor + 1], hs[:, :anchor])
    assert_close(out.hidden, ref["hidden"], what=f"speculators dflash2 {layers} hidden")
    assert_logits_match(out.slot_logits, ref["base_logits"], what=f"speculators dflash2 {layers} logits")
    prev, path = ids[0, anchor], []
    with torch.no_grad():
        for j in range(1, B):
            cands, scores = model.candidate_selector.select(ref["base_logits"][j][None], ref["hidden"][j][None],
                                                            prev[None])
            prev = cands[0, scores[0].argmax()]
            path.append(int(prev))
    assert out.tokens.tolist() == path
