"""Parity of the reference drafters with the peer implementations (fp32, CPU).

* speculators 0.9.0 (``DFlashDraftModel``, ``DSparkDraftModel``, ``PEagleDraftModel``):
  tiny models built with ``from_training_args`` on a tiny verifier saved with
  transformers, weights randomised, saved with ``save_pretrained``, loaded with
  :func:`specconv.drafters.load_drafter`; the speculators training forward is fed one
  fixed anchor (DFlash/DSpark) or a fixed COD sample (P-EAGLE) with eager attention.
* z-lab ``dflash`` 0.1.0 (``dflash.model.DFlashDraftModel``): a z-lab checkpoint saved
  with that package, turned into a Speculators dir by hand (target_layer_ids + 1,
  speculators_format.md §4.4), compared through its ``forward(target_hidden=...,
  noise_embedding=..., position_ids=...)``.

Gate (validation.md §4, "source ref <-> converted, fp32"): max |Δlogit| <= 1e-4 and
top-1 agreement 100% outside near-ties — G2's fp32 row, through ``tests/tolerances.py``
(two implementations are two compute paths: never bit for bit).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.peer

speculators = pytest.importorskip("speculators")
pytest.importorskip("dflash")
pytest.importorskip("loguru")  # speculators' verifier-weight loader imports it

from specconv.drafters import load_drafter  # noqa: E402
from tests.tolerances import assert_close, assert_ids_match, assert_logits_match  # noqa: E402

H, NLAYERS_V, VOCAB, MASK = 64, 6, 256, 255


# --------------------------------------------------------------------------- helpers
def _qwen3_cfg(**kw):
    from transformers import Qwen3Config

    base = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    base.update(kw)
    return Qwen3Config(**base)


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    """Tiny Qwen3 verifier (6 layers, vocab 256, untied head) saved with transformers."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(1234)
    d = tmp_path_factory.mktemp("verifier")
    m = Qwen3ForCausalLM(_qwen3_cfg(num_hidden_layers=NLAYERS_V, tie_word_embeddings=False))
    with torch.no_grad():
        m.model.embed_tokens.weight.normal_(0, 1.0)
        m.lm_head.weight.normal_(0, 1.0 / math.sqrt(H))
    m.save_pretrained(d)
    return d


def _randomise(model, skip=()):
    """Give every float tensor O(1)-scale random values (norm gains around 1)."""
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(name.startswith(s) for s in skip) or name.startswith("verifier_"):
                continue
            if p.dim() == 1 and ("norm" in name):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def _pruned_maps(vocab: int, vd: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    keep = torch.sort(torch.randperm(vocab, generator=g)[:vd]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    d2t = keep - torch.arange(vd)
    return t2d, d2t


def _features(T: int, A: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(1, T, A * H, generator=g)
    hs[..., 3] *= 8.0  # an outlier channel, as real aux states have
    ids = torch.randint(0, VOCAB - 1, (1, T), generator=g)
    return hs, ids


# ---------------------------------------------------------------- DFlash / DSpark
def _build_dflash_family(cls_name, verifier_dir, out_dir, *, layer_types, sliding_window,
                         non_causal, sfa, pruned, block_size=5, extra=None):
    from speculators.models import DFlashDraftModel, DSparkDraftModel

    cls = {"dflash": DFlashDraftModel, "dspark": DSparkDraftModel}[cls_name]
    cfg = _qwen3_cfg(num_hidden_layers=len(layer_types), layer_types=list(layer_types),
                     sliding_window=sliding_window,
                     use_sliding_window=sliding_window is not None)
    vd = 96 if pruned else VOCAB
    t2d, d2t = _pruned_maps(VOCAB, vd) if pruned else (None, None)
    kwargs = dict(verifier_name_or_path=str(verifier_dir), draft_vocab_size=vd,
                  block_size=block_size, target_layer_ids=[1, 3, 6], mask_token_id=MASK,
                  draft_attn_impl="eager", sliding_window_non_causal=non_causal,
                  sample_from_anchor=sfa)
    kwargs.update(extra or {})
    model = cls.from_training_args(cfg, t2d=t2d, d2t=d2t, **kwargs)
    # verifier-owned weights stay as loaded (0.9.0 does not save them for full vocab)
    _randomise(model, skip=("embed_tokens", "lm_head"))
    if cls_name == "dspark" and model.markov_head is not None:
        with torch.no_grad():
            model.markov_head.markov_w1.weight.normal_(0, 1.0)
    model.eval()
    model.save_pretrained(out_dir)
    return model


def _speculators_block(model, monkeypatch, hs, ids, anchor):
    """Run the speculators training forward with one fixed anchor; returns the
    per-slot tensors it computed (hidden, base logits, final logits, confidence)."""
    import speculators.models.dflash.core as dcore
    import speculators.models.dspark.core as score

    B = model.block_size
    monkeypatch.setattr(dcore, "select_anchors",
                        lambda *a, **k: (torch.tensor([anchor]), torch.tensor([True])))
    captured = {}

    def fake_metrics(logits, targets, confidence_logits, *a, **k):
        captured["logits"] = logits.detach()
        captured["confidence_logits"] = (confidence_logits.detach()
                                         if confidence_logits is not None else None)
        return torch.tensor(0.0), {}

    monkeypatch.setattr(score, "compute_metrics", fake_metrics)
    T = hs.shape[1]
    kw = dict(hidden_states=hs, input_ids=ids, loss_mask=torch.ones(1, T),
              verifier_last_hidden_states=torch.randn(1, T, H, dtype=hs.dtype),
              document_ids=torch.zeros(1, T, dtype=torch.long))
    with torch.no_grad():
        hidden, logits, *_ = model._backbone_forward(max_anchors=1, **kw)
        out = {"hidden": hidden[0], "base_logits": logits[0]}
        if type(model).__name__ == "DSparkDraftModel":
            model(max_anchors=1, **kw)
            out["logits"] = captured["logits"][0]
            cl = captured["confidence_logits"]
            out["confidence_logits"] = cl[0] if cl is not None else None
    assert out["base_logits"].shape[0] == B
    return out


DFLASH_CASES = {
    "all_full": dict(layer_types=["full_attention"] * 2, sliding_window=None, non_causal=False),
    "all_swa_causal": dict(layer_types=["sliding_attention"] * 2, sliding_window=4,
                           non_causal=False),
    "all_swa_noncausal": dict(layer_types=["sliding_attention"] * 2, sliding_window=4,
                              non_causal=True),
    "mixed": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3,
                  non_causal=False),
}


@pytest.mark.parametrize("case", sorted(DFLASH_CASES))
@pytest.mark.parametrize("sfa", [False, True], ids=["sfa0", "sfa1"])
def test_dflash_matches_speculators(case, sfa, verifier_dir, tmp_path, monkeypatch):
    pruned = case == "mixed"
    out_dir = tmp_path / "dflash"
    model = _build_dflash_family("dflash", verifier_dir, out_dir, sfa=sfa, pruned=pruned,
                                 **DFLASH_CASES[case])
    saved = set(json.loads((out_dir / "config.json").read_text()))
    assert "model_type" not in saved
    drafter = load_drafter(out_dir, verifier_dir)
    assert drafter.num_draft_tokens == (5 if sfa else 4)

    hs, ids = _features(T=16, A=3)
    anchor = 9  # context 0..8; window 3/4 < 9 so the SWA window binds
    ref = _speculators_block(model, monkeypatch, hs, ids, anchor)
    out = drafter.forward_block(ids[:, : anchor + 1], hs[:, :anchor])
    assert_close(out.hidden, ref["hidden"], what=f"dflash {case} hidden")
    assert_logits_match(out.slot_logits, ref["base_logits"], what=f"dflash {case} slot logits")
    slots = list(range(0 if sfa else 1, 5))
    assert out.draft_slots.tolist() == slots
    assert_logits_match(out.draft_logits, ref["base_logits"][slots], what=f"dflash {case} draft logits")
    if pruned:
        # target-vocab view: drafted ids map through d2t and equal the argmax of the
        # scattered logits
        assert torch.equal(out.tokens, out.target_logits.argmax(-1))
        assert torch.isinf(out.target_logits).sum(-1).eq(VOCAB - 96).all()
        assert torch.equal(out.tokens, model.d2t[out.draft_ids] + out.draft_ids)


DSPARK_CASES = {
    "vanilla_sfa1": dict(sfa=True, extra=dict(markov_rank=16, markov_head_type="vanilla")),
    "vanilla_sfa0": dict(sfa=False, extra=dict(markov_rank=16, markov_head_type="vanilla")),
    "gated_sfa1_pruned": dict(sfa=True, pruned=True,
                              extra=dict(markov_rank=16, markov_head_type="gated")),
    "gated_sfa0": dict(sfa=False, extra=dict(markov_rank=8, markov_head_type="gated")),
    "conf_without_markov": dict(sfa=True, extra=dict(markov_rank=16,
                                                     confidence_head_with_markov=False)),
    "no_markov_conf_plain": dict(sfa=True, extra=dict(markov_rank=0,
                                                      confidence_head_with_markov=False)),
    "no_conf_head_swa": dict(sfa=True, swa=True,
                             extra=dict(markov_rank=16, enable_confidence_head=False)),
}


@pytest.mark.parametrize("case", sorted(DSPARK_CASES))
def test_dspark_matches_speculators(case, verifier_dir, tmp_path, monkeypatch):
    c = DSPARK_CASES[case]
    swa = c.get("swa", False)
    out_dir = tmp_path / "dspark"
    model = _build_dflash_family(
        "dspark", verifier_dir, out_dir,
        layer_types=["sliding_attention"] * 2 if swa else ["full_attention", "full_attention"],
        sliding_window=4 if swa else None, non_causal=False, sfa=c["sfa"],
        pruned=c.get("pruned", False), extra=c["extra"])
    drafter = load_drafter(out_dir, verifier_dir)
    B = 5
    N = B if c["sfa"] else B - 1
    assert drafter.num_draft_tokens == N

    hs, ids = _features(T=16, A=3, seed=11)
    anchor = 8
    # first our sequential greedy pass, then teacher-force speculators with our picks:
    # prev_s of slot s = anchor, y_0, y_1, ... in both implementations
    out = drafter.forward_block(ids[:, : anchor + 1], hs[:, :anchor])
    ids = ids.clone()
    ids[0, anchor + 1: anchor + N] = out.tokens[: N - 1]
    ref = _speculators_block(model, monkeypatch, hs, ids, anchor)
    slots = list(range(0 if c["sfa"] else 1, B))
    assert_logits_match(out.slot_logits, ref["base_logits"], what=f"dspark {case} base logits")
    assert_logits_match(out.draft_logits, ref["logits"][slots], what=f"dspark {case} markov logits")
    assert torch.equal(out.draft_ids, out.draft_logits.argmax(-1))
    if drafter.confidence_proj is not None:
        assert ref["confidence_logits"] is not None
        assert_close(out.confidence_logits, ref["confidence_logits"][slots],
                     what=f"dspark {case} confidence")
        assert torch.allclose(out.confidence, torch.sigmoid(out.confidence_logits))
    else:
        assert out.confidence is None
    # propose() returns the same drafts, as target ids
    prop = drafter.propose(ids[:, : anchor + 1], hs[:, :anchor])
    assert torch.equal(prop.tokens, out.tokens)


# ---------------------------------------------------------------------------- P-EAGLE
def _build_peagle(verifier_dir, out_dir, *, model_type, nbr, pruned, K, extra=None,
                  layer_types=None, sliding_window=None):
    from speculators.models import PEagleDraftModel
    from transformers import LlamaConfig

    nl = 2
    lt = layer_types or ["full_attention"] * nl
    if model_type == "qwen3":
        cfg = _qwen3_cfg(num_hidden_layers=nl, layer_types=lt, sliding_window=sliding_window,
                         use_sliding_window=sliding_window is not None)
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=128,
                          num_hidden_layers=nl, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, max_position_embeddings=512,
                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    vd = 100 if pruned else VOCAB
    t2d, d2t = _pruned_maps(VOCAB, vd, seed=3) if pruned else (None, None)
    kwargs = dict(verifier_name_or_path=str(verifier_dir), draft_vocab_size=vd,
                  target_layer_ids=[2, 3, 6], mask_token_id=MASK, draft_attn_impl="eager",
                  norm_before_residual=nbr, num_depths=K)
    kwargs.update(extra or {})
    model = PEagleDraftModel.from_training_args(cfg, t2d=t2d, d2t=d2t, **kwargs)
    _randomise(model, skip=("lm_head",))
    model.eval()
    model.save_pretrained(out_dir)
    return model


def _speculators_peagle(model, monkeypatch, hs, ids, p, K):
    import speculators.models.peagle.core as pcore

    T = hs.shape[1]
    anchor_pos = torch.cat([torch.arange(T), torch.full((K - 1,), p)])
    depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, K)])
    monkeypatch.setattr(pcore, "generate_cod_sample_indices", lambda **k: (anchor_pos, depth))
    captured = {}

    def fake_metrics(logits, **k):
        captured["logits"] = logits.detach()
        return torch.tensor(0.0), {}

    monkeypatch.setattr(pcore, "compute_metrics", fake_metrics)
    with torch.no_grad():
        model(hidden_states=hs, input_ids=ids, document_ids=torch.zeros(1, T, dtype=torch.long),
              loss_mask=torch.ones(1, T), verifier_last_hidden_states=torch.randn(1, T, H, dtype=hs.dtype),
              num_depths=K)
    lg = captured["logits"][0]
    return lg[: p + 1], lg[T:]  # depth-0 entries 0..p, then depths 1..K-1 of anchor p


PEAGLE_CASES = {
    "qwen3_nbr1": dict(model_type="qwen3", nbr=True, pruned=False),
    "qwen3_nbr0_pruned": dict(model_type="qwen3", nbr=False, pruned=True),
    "llama_nbr1_pruned": dict(model_type="llama", nbr=True, pruned=True),
    "llama_nbr0_norm_before_fc": dict(model_type="llama", nbr=False, pruned=False,
                                      extra=dict(norm_before_fc=True)),
    "qwen3_fc_norm_swa": dict(model_type="qwen3", nbr=True, pruned=False,
                              extra=dict(fc_norm=True),
                              layer_types=["sliding_attention", "full_attention"],
                              sliding_window=4),
}


@pytest.mark.parametrize("case", sorted(PEAGLE_CASES))
def test_peagle_matches_speculators(case, verifier_dir, tmp_path, monkeypatch):
    c = dict(PEAGLE_CASES[case])
    K = 4
    out_dir = tmp_path / "peagle"
    model = _build_peagle(verifier_dir, out_dir, K=K, **c)
    drafter = load_drafter(out_dir, verifier_dir)
    assert drafter.num_draft_tokens == K

    p = 9  # bonus entry index; features g_0..g_9
    hs, ids = _features(T=p + K, A=3, seed=21)  # long enough for anchor p + depth K-1
    ref_ctx, ref_mask = _speculators_peagle(model, monkeypatch, hs, ids, p, K)
    # entry i holds token t_{i+1} = ids[i]; context_tokens = [t_0, t_1, ..., t_{p+1}]
    ctx_tokens = torch.cat([torch.tensor([[7]]), ids[:, : p + 1]], dim=1)
    out = drafter.forward_block(ctx_tokens, hs[:, : p + 1])
    assert_logits_match(out.slot_logits[: p + 1], ref_ctx, what=f"peagle {case} depth-0 entries")
    assert_logits_match(out.slot_logits[p + 1:], ref_mask, what=f"peagle {case} mask entries")
    per_depth = torch.cat([ref_ctx[p:p + 1], ref_mask])
    assert_logits_match(out.draft_logits, per_depth, what=f"peagle {case} per-depth logits")
    assert out.draft_slots.tolist() == list(range(p, p + K))
    prop = drafter.propose(ctx_tokens, hs[:, : p + 1])
    assert prop.tokens.shape == (K,)
    assert torch.equal(prop.tokens, prop.logits.argmax(-1))


# ------------------------------------------------------------------------ z-lab DFlash
def _zlab_to_speculators(zdir: Path, out: Path, *, non_causal: bool, verifier_dir: Path):
    """Hand-made Speculators dir from a z-lab DFlash checkpoint (speculators_format.md
    §4.4 / §7.2); the real converter lives in converters/ and can replace this."""
    zc = json.loads((zdir / "config.json").read_text())
    dc = zc["dflash_config"]
    block = zc.get("block_size", dc.get("block_size"))
    tl = {k: v for k, v in zc.items()
          if k not in ("architectures", "auto_map", "block_size", "dflash_config",
                       "num_target_layers", "dtype", "torch_dtype", "transformers_version")}
    tl["model_type"] = "qwen3"
    tl["tie_word_embeddings"] = False
    vcfg = json.loads((verifier_dir / "config.json").read_text())
    cfg = {
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "architectures": ["DFlashDraftModel"],
        "draft_vocab_size": zc["vocab_size"],
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in dc["target_layer_ids"]],
        "mask_token_id": dc["mask_token_id"],
        "block_size": block,
        "sample_from_anchor": False,
        "sliding_window_non_causal": non_causal,
        "transformer_layer_config": tl,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "local/tiny-verifier",
                         "architectures": vcfg.get("architectures", [])},
        },
    }
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(zdir / "model.safetensors", out / "model.safetensors")


ZLAB_CASES = {
    "all_full": dict(layer_types=["full_attention"] * 2, sliding_window=None, non_causal=True),
    # z-lab's SWA window is per query; with W >= T+B it never binds, so the two agree
    "swa_causal_wide": dict(layer_types=["sliding_attention", "full_attention"],
                            sliding_window=64, non_causal=False),
}


@pytest.mark.parametrize("case", sorted(ZLAB_CASES))
def test_dflash_matches_zlab(case, verifier_dir, tmp_path):
    from dflash.model import DFlashDraftModel as ZDFlash
    from safetensors.torch import load_file

    c = ZLAB_CASES[case]
    B = 6
    zcfg = _qwen3_cfg(num_hidden_layers=2, layer_types=c["layer_types"],
                      sliding_window=c["sliding_window"],
                      use_sliding_window=c["sliding_window"] is not None,
                      num_target_layers=NLAYERS_V, block_size=B,
                      dflash_config={"target_layer_ids": [0, 2, 4, 5], "mask_token_id": MASK})
    zcfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(0)
    zmodel = ZDFlash(zcfg)
    _randomise(zmodel)
    zmodel.eval()
    zdir = tmp_path / "zlab"
    zmodel.save_pretrained(zdir)
    sdir = tmp_path / "spec"
    _zlab_to_speculators(zdir, sdir, non_causal=c["non_causal"], verifier_dir=verifier_dir)
    drafter = load_drafter(sdir, verifier_dir)
    assert drafter.aux_layer_ids == [1, 3, 5, 6]

    vw = load_file(str(verifier_dir / "model.safetensors"))
    embed, head = vw["model.embed_tokens.weight"], vw["lm_head.weight"]
    hs, ids = _features(T=12, A=4, seed=3)
    a = 11
    block = torch.full((1, B), MASK)
    block[0, 0] = ids[0, a]
    with torch.no_grad():
        zh = zmodel(target_hidden=hs[:, :a], noise_embedding=embed[block],
                    position_ids=torch.arange(a + B)[None])
    ref_logits = zh[0] @ head.T
    out = drafter.forward_block(ids[:, : a + 1], hs[:, :a])
    assert_close(out.hidden, zh[0], what=f"zlab {case} hidden")
    assert_logits_match(out.slot_logits, ref_logits, what=f"zlab {case} logits")
    assert_ids_match(out.tokens, ref_logits[1:].argmax(-1), ref_logits[1:], what=f"zlab {case} drafted ids")
