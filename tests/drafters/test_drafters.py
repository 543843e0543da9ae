"""Unit tests of the reference drafters (no peer packages needed).

Tiny Speculators-format dirs are written by hand (config per speculators_format.md
§3.4 / §4.4 / §5.4, random tensors), next to a tiny tied-embedding verifier dir.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specconv.drafters import load_drafter
from specconv.drafters.base import VocabMap
from specconv.errors import InvalidInputError, UnsupportedFormatError, UsageError

H, NH, NKV, D, INTER, VT, MASK = 32, 4, 2, 8, 48, 64, 63


def _rand(*shape, g):
    return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])


def _tl(num_layers=2, model_type="qwen3", layer_types=None, sliding_window=None, **kw):
    d = {"model_type": model_type, "vocab_size": VT, "hidden_size": H, "intermediate_size": INTER,
         "num_hidden_layers": num_layers, "num_attention_heads": NH, "num_key_value_heads": NKV,
         "head_dim": D, "hidden_act": "silu", "rms_norm_eps": 1e-6,
         "max_position_embeddings": 256, "attention_bias": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
         "layer_types": layer_types or ["full_attention"] * num_layers,
         "sliding_window": sliding_window, "use_sliding_window": sliding_window is not None,
         "tie_word_embeddings": False}
    d.update(kw)
    return d


def _layer(t, i, g, *, qk_norm=True, attn_in=H):
    p = f"layers.{i}"
    t[f"{p}.input_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    t[f"{p}.post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    t[f"{p}.self_attn.q_proj.weight"] = _rand(NH * D, attn_in, g=g)
    t[f"{p}.self_attn.k_proj.weight"] = _rand(NKV * D, attn_in, g=g)
    t[f"{p}.self_attn.v_proj.weight"] = _rand(NKV * D, attn_in, g=g)
    t[f"{p}.self_attn.o_proj.weight"] = _rand(H, NH * D, g=g)
    if qk_norm:
        t[f"{p}.self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
        t[f"{p}.self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
    t[f"{p}.mlp.gate_proj.weight"] = _rand(INTER, H, g=g)
    t[f"{p}.mlp.up_proj.weight"] = _rand(INTER, H, g=g)
    t[f"{p}.mlp.down_proj.weight"] = _rand(H, INTER, g=g)


def _envelope(algo, k):
    return {"algorithm": algo,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "org/tiny", "architectures": ["LlamaForCausalLM"]}}


def _pruned(vd, seed=4):
    g = torch.Generator().manual_seed(seed)
    keep = torch.sort(torch.randperm(VT, generator=g)[:vd]).values
    t2d = torch.zeros(VT, dtype=torch.bool)
    t2d[keep] = True
    return keep - torch.arange(vd), t2d


def _write(d: Path, cfg: dict, tensors: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
    return d


def make_dflash(d: Path, *, algo="dflash", block=4, sfa=None, vd=VT, aux=(1, 2, 4),
                layer_types=None, sliding_window=None, non_causal=False, seed=0,
                markov_rank=8, head_type="vanilla", conf=True, conf_markov=True,
                tl_extra=None, extra_tensors=None, drop=()):
    g = torch.Generator().manual_seed(seed)
    A = len(aux)
    nl = len(layer_types) if layer_types else 2
    if sfa is None:
        sfa = algo == "dspark"
    t = {"fc.weight": _rand(H, A * H, g=g), "hidden_norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
         "norm.weight": 1 + 0.1 * torch.randn(H, generator=g)}
    for i in range(nl):
        _layer(t, i, g)
    if vd != VT:
        d2t, t2d = _pruned(vd)
        t["d2t"], t["t2d"] = d2t, t2d
        t["lm_head.weight"] = _rand(vd, H, g=g)
    cfg = {"speculators_model_type": algo, "draft_vocab_size": vd,
           "aux_hidden_state_layer_ids": list(aux), "mask_token_id": MASK, "block_size": block,
           "sample_from_anchor": sfa, "sliding_window_non_causal": non_causal,
           "transformer_layer_config": _tl(nl, layer_types=layer_types,
                                           sliding_window=sliding_window, **(tl_extra or {})),
           "speculators_config": _envelope(algo, block if sfa else block - 1)}
    if algo == "dspark":
        cfg.update(markov_rank=markov_rank, markov_head_type=head_type,
                   enable_confidence_head=conf, confidence_head_with_markov=conf_markov)
        if markov_rank:
            t["markov_head.markov_w1.weight"] = torch.randn(VT, markov_rank, generator=g)
            t["markov_head.markov_w2.weight"] = _rand(vd, markov_rank, g=g)
            if head_type == "gated":
                t["markov_head.gate_proj.weight"] = _rand(markov_rank, H + markov_rank, g=g)
                t["markov_head.gate_proj.bias"] = torch.randn(markov_rank, generator=g)
            if head_type == "rnn":
                t["markov_head.joint_proj.weight"] = _rand(3 * markov_rank, 2 * markov_rank + H, g=g)
                t["markov_head.joint_proj.bias"] = torch.randn(3 * markov_rank, generator=g)
        if conf:
            w = H + (markov_rank if conf_markov else 0)
            t["confidence_head.proj.weight"] = _rand(1, w, g=g)
            t["confidence_head.proj.bias"] = torch.randn(1, generator=g)
    t.update(extra_tensors or {})
    for k in drop:
        t.pop(k)
    return _write(d, cfg, t)


def make_peagle(d: Path, *, K=3, vd=VT, aux=(1, 2, 4), model_type="llama", nbr=True, seed=0,
                drop=(), num_layers=2):
    g = torch.Generator().manual_seed(seed)
    A = len(aux)
    t = {"embed_tokens.weight": torch.randn(VT, H, generator=g), "fc.weight": _rand(H, A * H, g=g),
         "mask_hidden": torch.randn(1, 1, A * H, generator=g),
         "layers.0.hidden_norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
         "norm.weight": 1 + 0.1 * torch.randn(H, generator=g), "lm_head.weight": _rand(vd, H, g=g)}
    for i in range(num_layers):
        _layer(t, i, g, qk_norm=model_type == "qwen3", attn_in=2 * H if i == 0 else H)
    if vd != VT:
        t["d2t"], t["t2d"] = _pruned(vd)
    for k in drop:
        t.pop(k)
    cfg = {"speculators_model_type": "peagle", "draft_vocab_size": vd,
           "eagle_aux_hidden_state_layer_ids": list(aux), "mask_token_id": MASK,
           "norm_before_residual": nbr, "norm_before_fc": False, "fc_norm": False,
           "transformer_layer_config": _tl(num_layers, model_type=model_type),
           "speculators_config": _envelope("peagle", K)}
    return _write(d, cfg, t)


def _inputs(T, A=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VT - 1, (1, T + 1), generator=g),
            torch.randn(1, T, A * H, generator=g))


# ------------------------------------------------------------------------ d2t / vocab
def test_vocab_map_offsets_and_scatter():
    d2t = torch.tensor([0, 2, 3, 5])  # draft 0..3 -> target 0, 3, 5, 8
    vm = VocabMap(d2t, target_vocab_size=10, draft_vocab_size=4)
    assert vm.to_target_ids(torch.tensor([0, 1, 2, 3])).tolist() == [0, 3, 5, 8]
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    full = vm.to_target_logits(logits)
    assert full.shape == (1, 10)
    assert full[0, [0, 3, 5, 8]].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert torch.isinf(full[0, [1, 2, 4, 6, 7, 9]]).all()
    assert int(full.argmax(-1)) == int(vm.to_target_ids(logits.argmax(-1)))


def test_vocab_map_identity_and_errors():
    vm = VocabMap(None, 5, 5)
    ids = torch.tensor([4, 0])
    assert vm.identity and torch.equal(vm.to_target_ids(ids), ids)
    with pytest.raises(InvalidInputError, match="no d2t"):
        VocabMap(None, 10, 4)
    with pytest.raises(InvalidInputError, match="outside"):
        VocabMap(torch.tensor([0, 0, 9]), 10, 3)
    with pytest.raises(InvalidInputError, match="same target"):
        VocabMap(torch.tensor([1, 0, 0]), 10, 3)


def test_pruned_drafter_maps_through_d2t(tmp_path, verifier_dir):
    d = make_dflash(tmp_path / "dfl", vd=20)
    drafter = load_drafter(d, verifier_dir)
    tok, hs = _inputs(6)
    out = drafter.forward_block(tok, hs)
    d2t, t2d = _pruned(20)
    assert torch.equal(out.tokens, out.draft_ids + d2t[out.draft_ids])
    assert t2d[out.tokens].all()
    assert out.target_logits.shape == (3, VT)
    assert torch.isfinite(out.target_logits).sum(-1).eq(20).all()
    assert torch.equal(out.target_logits.argmax(-1), out.tokens)


# ------------------------------------------------------------------ k per algorithm
@pytest.mark.parametrize("algo,sfa,block,k", [("dflash", False, 5, 4), ("dflash", True, 5, 5),
                                              ("dspark", True, 4, 4), ("dspark", False, 4, 3)])
def test_propose_returns_k_tokens_dflash_family(tmp_path, verifier_dir, algo, sfa, block, k):
    d = make_dflash(tmp_path / algo, algo=algo, block=block, sfa=sfa)
    drafter = load_drafter(d, verifier_dir)
    assert (drafter.algorithm, drafter.block_size, drafter.num_draft_tokens) == (algo, block, k)
    assert drafter.aux_layer_ids == [1, 2, 4] and drafter.mask_token_id == MASK
    assert drafter.vocab_size == VT and drafter.draft_vocab_size == VT
    tok, hs = _inputs(7)
    prop = drafter.propose(tok, hs)
    assert prop.tokens.shape == (k,) and prop.tokens.dtype == torch.long
    assert prop.logits.shape == (k, VT)
    assert torch.equal(prop.tokens, prop.logits.argmax(-1))
    if algo == "dspark":
        assert prop.confidence.shape == (k,)
        assert ((prop.confidence > 0) & (prop.confidence < 1)).all()
    else:
        assert prop.confidence is None


def test_propose_returns_K_tokens_peagle(tmp_path, verifier_dir):
    drafter = load_drafter(make_peagle(tmp_path / "pe", K=4), verifier_dir)
    assert drafter.algorithm == "peagle" and drafter.num_draft_tokens == 4
    tok, hs = _inputs(5)
    out = drafter.forward_block(tok, hs)
    assert out.slot_logits.shape == (5 + 3, VT)
    assert out.draft_slots.tolist() == [4, 5, 6, 7]
    assert out.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert drafter.propose(tok, hs).tokens.shape == (4,)


def test_dflash_ignores_context_tokens_except_anchor(tmp_path, verifier_dir):
    drafter = load_drafter(make_dflash(tmp_path / "d"), verifier_dir)
    tok, hs = _inputs(6)
    a = drafter.forward_block(tok, hs).slot_logits
    tok2 = tok.clone()
    tok2[0, :-1] = (tok2[0, :-1] + 1) % VT
    # exact: one code path, the same shapes and the same numbers reach every kernel
    assert torch.equal(drafter.forward_block(tok2, hs).slot_logits, a)
    tok3 = tok.clone()
    tok3[0, -1] = (tok3[0, -1] + 1) % VT
    assert not torch.allclose(drafter.forward_block(tok3, hs).slot_logits, a)


# -------------------------------------------------------------------- attention masks
def test_dflash_swa_window_is_anchor_relative(tmp_path, verifier_dir):
    W = 3
    drafter = load_drafter(make_dflash(tmp_path / "swa", layer_types=["sliding_attention"] * 2,
                                       sliding_window=W), verifier_dir)
    tok, hs = _inputs(8)
    base = drafter.forward_block(tok, hs).slot_logits
    old = hs.clone()
    old[0, : 8 - W] += 5.0  # positions < a - W are outside every slot's window
    # exact: one code path and shapes; masked scores are -inf whatever the keys, so their
    # softmax weights are exactly 0 and the changed rows cannot move a bit
    assert torch.equal(drafter.forward_block(tok, old).slot_logits, base)
    inside = hs.clone()
    inside[0, 8 - W] += 5.0
    assert not torch.allclose(drafter.forward_block(tok, inside).slot_logits, base)


@pytest.mark.parametrize("non_causal", [False, True])
def test_dflash_block_causality(tmp_path, verifier_dir, non_causal):
    """Full layers: bidirectional; SWA layers: causal unless sliding_window_non_causal."""
    drafter = load_drafter(make_dflash(tmp_path / "c", layer_types=["sliding_attention"] * 2,
                                       sliding_window=16, non_causal=non_causal), verifier_dir)
    tok, hs = _inputs(5)
    m = drafter.block_mask(0, drafter._request(*drafter._check_inputs(tok, hs)))[0]
    assert m.shape == (4, 9)
    assert m[:, :5].all()
    blk = m[:, 5:]
    assert bool(blk.all()) == non_causal
    assert torch.equal(blk.tril(), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    full = load_drafter(make_dflash(tmp_path / "f"), verifier_dir)
    assert full.block_mask(0, full._request(*full._check_inputs(tok, hs))).all()


def test_swa_switched_off_attends_fully(tmp_path, verifier_dir):
    """Qwen3 layers listed as sliding_attention with ``use_sliding_window: false`` run as full
    attention (transformers' Qwen3Config nulls the window; speculators and vLLM build that config;
    the lint's ``swa-disabled``)."""
    d = make_dflash(tmp_path / "off", layer_types=["sliding_attention"] * 2, sliding_window=3,
                    tl_extra={"use_sliding_window": False})
    drafter = load_drafter(d, verifier_dir)
    assert drafter.windows == [None, None]
    tok, hs = _inputs(8)
    far = hs.clone()
    far[0, 0] += 5.0  # outside a 3-window: moves the drafts only because every key is visible
    assert not torch.allclose(drafter.forward_block(tok, far).slot_logits, drafter.forward_block(tok, hs).slot_logits)


def test_peagle_mask_entries_do_not_leak_into_context(tmp_path, verifier_dir):
    drafter = load_drafter(make_peagle(tmp_path / "pe", K=4), verifier_dir)
    tok, hs = _inputs(6)
    a = drafter.forward_block(tok, hs)
    with torch.no_grad():
        drafter.mask_hidden.add_(1.0)
    b = drafter.forward_block(tok, hs)
    # depth 0 (bonus entry) and every context entry are causal wrt the mask entries (exact:
    # one code path and shapes, masked weights exactly 0)
    assert torch.equal(a.slot_logits[:6], b.slot_logits[:6])
    assert not torch.allclose(a.slot_logits[6:], b.slot_logits[6:])
    m = drafter.entry_mask(0, *drafter.entries(drafter._request(*drafter._check_inputs(tok, hs))))[0]
    assert torch.equal(m, torch.tril(torch.ones(9, 9, dtype=torch.bool)))


def test_peagle_requires_context(tmp_path, verifier_dir):
    drafter = load_drafter(make_peagle(tmp_path / "pe"), verifier_dir)
    with pytest.raises(UsageError, match="T >= 1"):
        drafter.propose(torch.tensor([[3]]), torch.zeros(1, 0, 3 * H))


def test_shape_errors(tmp_path, verifier_dir):
    drafter = load_drafter(make_dflash(tmp_path / "d"), verifier_dir)
    tok, hs = _inputs(4)
    with pytest.raises(UsageError, match="T\\+1"):
        drafter.propose(tok[:, :-1], hs)
    with pytest.raises(UsageError, match="A\\*H"):
        drafter.propose(tok, hs[..., :H])


def test_target_hidden_size_sets_aux_width(tmp_path, verifier_dir):
    """A verifier wider than the draft: fc is [H, A*Ht] and aux_hidden is [1, T, A*Ht]."""
    Ht = 40
    g = torch.Generator().manual_seed(3)
    d = make_dflash(tmp_path / "d", extra_tensors={"fc.weight": _rand(H, 3 * Ht, g=g)})
    cfg = json.loads((d / "config.json").read_text())
    cfg["target_hidden_size"] = Ht
    (d / "config.json").write_text(json.dumps(cfg))
    drafter = load_drafter(d, verifier_dir)
    assert drafter.aux_hidden_size == Ht
    tok, _ = _inputs(4)
    assert drafter.propose(tok, torch.randn(1, 4, 3 * Ht)).tokens.shape == (3,)
    with pytest.raises(UsageError, match="A\\*H"):
        drafter.propose(tok, torch.randn(1, 4, 3 * H))


# ------------------------------------------------------------------------- DSpark loop
def test_dspark_markov_conditions_on_sampled_tokens(tmp_path, verifier_dir):
    drafter = load_drafter(make_dspark_dir(tmp_path), verifier_dir)
    tok, hs = _inputs(5)
    gen = torch.Generator().manual_seed(0)
    out = drafter.forward_block(tok, hs, temperature=1.5, generator=gen)
    w1, w2 = drafter.markov_w1, drafter.markov_w2.weight
    prev = [int(tok[0, -1])] + out.tokens[:-1].tolist()
    expect = out.slot_logits[out.draft_slots] + w1[prev] @ w2.T
    assert torch.allclose(out.draft_logits, expect, atol=1e-5)
    # sampling is reproducible with a generator and is not always the argmax
    again = drafter.forward_block(tok, hs, temperature=1.5,
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.tokens, out.tokens)
    draws = {tuple(drafter.propose(tok, hs, temperature=5.0,
                                   generator=torch.Generator().manual_seed(s)).tokens.tolist())
             for s in range(8)}
    assert len(draws) > 1


def make_dspark_dir(tmp_path, **kw):
    return make_dflash(tmp_path / "dsp", algo="dspark", block=4, **kw)


def test_dspark_teacher_forced_prev_tokens(tmp_path, verifier_dir):
    drafter = load_drafter(make_dspark_dir(tmp_path, head_type="gated"), verifier_dir)
    tok, hs = _inputs(5)
    free = drafter.forward_block(tok, hs)
    forced = drafter.forward_block(tok, hs, prev_tokens=torch.tensor([int(tok[0, -1]), 1, 2, 3]))
    assert torch.equal(free.draft_logits[0], forced.draft_logits[0])
    assert not torch.allclose(free.draft_logits[1:], forced.draft_logits[1:])


def test_dspark_confidence_without_markov(tmp_path, verifier_dir):
    drafter = load_drafter(make_dspark_dir(tmp_path, markov_rank=0, conf_markov=False),
                           verifier_dir)
    out = drafter.forward_block(*_inputs(5))
    assert drafter.markov_w1 is None
    assert torch.equal(out.draft_logits, out.slot_logits[out.draft_slots])
    w = drafter.confidence_proj
    assert torch.allclose(out.confidence_logits,
                          out.hidden[out.draft_slots] @ w.weight[0] + w.bias[0], atol=1e-6)


# ----------------------------------------------------------------- verifier weights
def test_dflash_takes_embed_and_tied_head_from_verifier(tmp_path, verifier_dir):
    from safetensors.torch import load_file

    drafter = load_drafter(make_dflash(tmp_path / "d"), verifier_dir)
    emb = load_file(str(verifier_dir / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(drafter.embed_tokens, emb)
    assert torch.equal(drafter.lm_head.weight, emb)  # tied verifier: head = embedding
    with pytest.raises(InvalidInputError, match="verifier"):
        load_drafter(make_dflash(tmp_path / "d2"), None)


def test_peagle_uses_its_own_embedding(tmp_path, verifier_dir):
    d = make_peagle(tmp_path / "pe")
    from safetensors.torch import load_file

    drafter = load_drafter(d, None)  # self-contained: no verifier needed
    assert torch.equal(drafter.embed_tokens,
                       load_file(str(d / "model.safetensors"))["embed_tokens.weight"])


# ----------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_reduced_precision(tmp_path, verifier_dir, dtype, algo):
    d = make_peagle(tmp_path / "p") if algo == "peagle" else make_dflash(tmp_path / "d", algo=algo)
    ref = load_drafter(d, verifier_dir)
    low = load_drafter(d, verifier_dir, dtype=dtype)
    assert all(p.dtype == dtype for p in low.parameters() if p.is_floating_point())
    tok, hs = _inputs(6)
    a, b = ref.forward_block(tok, hs), low.forward_block(tok, hs)  # hs is fp32: cast inside
    assert b.slot_logits.dtype == dtype
    assert torch.isfinite(b.slot_logits).all()
    cos = torch.nn.functional.cosine_similarity(a.slot_logits, b.slot_logits.float(), dim=-1)
    assert cos.min() > 0.99
    assert (a.slot_logits - b.slot_logits.float()).abs().max() > 0  # really ran in low precision


def test_unsupported_dtype(tmp_path, verifier_dir):
    with pytest.raises(UsageError, match="dtype"):
        load_drafter(make_dflash(tmp_path / "d"), verifier_dir, dtype=torch.float64)


# ----------------------------------------------------------------------------- errors
def test_rnn_markov_head_refused(tmp_path, verifier_dir):
    with pytest.raises(UnsupportedFormatError, match="rnn"):
        load_drafter(make_dspark_dir(tmp_path, head_type="rnn"), verifier_dir)


def test_gated_attention_refused_by_config(tmp_path, verifier_dir):
    d = make_dflash(tmp_path / "g", tl_extra={"attn_output_gate": True})
    with pytest.raises(UnsupportedFormatError, match="gated attention"):
        load_drafter(d, verifier_dir)


def test_gated_attention_refused_by_tensors(tmp_path, verifier_dir):
    d = make_dflash(tmp_path / "g",
                    extra_tensors={"layers.0.self_attn.g_proj.weight": torch.zeros(H, H)})
    with pytest.raises(UnsupportedFormatError, match="gated attention"):
        load_drafter(d, verifier_dir)


def test_unexpected_tensor_refused(tmp_path, verifier_dir):
    d = make_dflash(tmp_path / "x", extra_tensors={"mask_hidden": torch.zeros(1, 1, 3 * H)})
    with pytest.raises(UnsupportedFormatError, match="mask_hidden"):
        load_drafter(d, verifier_dir)


def test_missing_tensors(tmp_path, verifier_dir):
    with pytest.raises(InvalidInputError, match="mask_hidden"):
        load_drafter(make_peagle(tmp_path / "p", drop=("mask_hidden",)), verifier_dir)
    with pytest.raises(InvalidInputError, match="d2t"):
        load_drafter(make_dflash(tmp_path / "d", vd=20, drop=("d2t",)), verifier_dir)
    with pytest.raises(InvalidInputError, match="lm_head"):
        load_drafter(make_dflash(tmp_path / "h", vd=20, drop=("lm_head.weight",)), verifier_dir)
    with pytest.raises(InvalidInputError, match="layers.1.mlp.up_proj.weight"):
        load_drafter(make_dflash(tmp_path / "u", drop=("layers.1.mlp.up_proj.weight",)),
                     verifier_dir)


def test_config_errors(tmp_path, verifier_dir):
    d = make_dflash(tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    for mutate, err, pat in [
        (lambda c: c.pop("speculators_model_type"), InvalidInputError, "speculators_model_type"),
        (lambda c: c.update(speculators_model_type="eagle3"), UnsupportedFormatError, "eagle3"),
        (lambda c: c.pop("mask_token_id"), InvalidInputError, "mask_token_id"),
        (lambda c: c.pop("aux_hidden_state_layer_ids"), InvalidInputError, "aux_hidden_state"),
        (lambda c: c["transformer_layer_config"]["rope_parameters"].update(rope_type="yarn"),
         UnsupportedFormatError, "yarn"),
        (lambda c: c["transformer_layer_config"].update(hidden_act="gelu"),
         UnsupportedFormatError, "gelu"),
    ]:
        c = json.loads(json.dumps(cfg))
        mutate(c)
        (d / "config.json").write_text(json.dumps(c))
        with pytest.raises(err, match=pat):
            load_drafter(d, verifier_dir)


def test_peagle_model_type_checked(tmp_path, verifier_dir):
    d = make_peagle(tmp_path / "p")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"]["model_type"] = "mistral"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedFormatError, match="mistral"):
        load_drafter(d, verifier_dir)


def test_rope_theta_top_level_and_llama3(tmp_path, verifier_dir):
    from specconv.drafters.layers import Rotary
    from specconv.format.schema import TransformerLayerConfig

    def rope(**keys):
        tl = {k: v for k, v in _tl().items() if k != "rope_parameters"}
        return Rotary(TransformerLayerConfig.model_validate({**tl, **keys}).rope(), D)

    a = rope(rope_theta=500.0)
    b = rope(rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    assert torch.equal(a.inv_freq, b.inv_freq)
    assert torch.allclose(a.inv_freq, 1.0 / 500.0 ** (torch.arange(0, D, 2).float() / D))
    rp = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 512}  # one medium band
    l3 = rope(rope_parameters=rp)
    plain = rope(rope_theta=500000.0)
    assert l3.inv_freq[0] == plain.inv_freq[0]  # high frequencies untouched
    assert torch.isclose(l3.inv_freq[-1], plain.inv_freq[-1] / 8.0)  # low ones scaled
    # same table as transformers' llama3 rope
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    lc = LlamaConfig(hidden_size=H, num_attention_heads=NH, head_dim=D, rope_parameters=rp)
    ref, scale = ROPE_INIT_FUNCTIONS["llama3"](lc, "cpu")
    assert torch.allclose(l3.inv_freq, ref) and scale == 1.0
    with pytest.raises(InvalidInputError, match="rope_theta"):
        Rotary({"rope_type": "default"}, D)


def test_import_is_torch_free():
    code = "import sys, specconv.drafters; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------ real verifier (SmolLM2)
@pytest.mark.slow
def test_real_smollm2_features_fp32_vs_fp16(tmp_path):
    """A SmolLM2-shaped DFlash drafter (H=576, 9/3 heads) on real captured aux states.

    Embedding and LM head come from the tied SmolLM2 checkpoint; real aux states have
    large outlier channels, which is where fp16 overflow would show (validation.md §4).
    """
    from transformers import AutoModelForCausalLM

    from specconv.offline import smollm2_verifier_dir

    vdir = smollm2_verifier_dir()
    vcfg = json.loads((vdir / "config.json").read_text())
    Hs, V, ids = vcfg["hidden_size"], vcfg["vocab_size"], [2, 15, 28]
    g = torch.Generator().manual_seed(0)
    t = {"fc.weight": _rand(Hs, 3 * Hs, g=g), "hidden_norm.weight": torch.ones(Hs),
         "norm.weight": torch.ones(Hs)}
    p = "layers.0"
    for n, shape in [("self_attn.q_proj", (576, Hs)), ("self_attn.k_proj", (192, Hs)),
                     ("self_attn.v_proj", (192, Hs)), ("self_attn.o_proj", (Hs, 576)),
                     ("mlp.gate_proj", (1536, Hs)), ("mlp.up_proj", (1536, Hs)),
                     ("mlp.down_proj", (Hs, 1536))]:
        t[f"{p}.{n}.weight"] = _rand(*shape, g=g)
    for n in ("input_layernorm", "post_attention_layernorm"):
        t[f"{p}.{n}.weight"] = torch.ones(Hs)
    t[f"{p}.self_attn.q_norm.weight"] = torch.ones(64)
    t[f"{p}.self_attn.k_norm.weight"] = torch.ones(64)
    tl = {"model_type": "qwen3", "vocab_size": V, "hidden_size": Hs, "intermediate_size": 1536,
          "num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3,
          "head_dim": 64, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default",
                                                                    "rope_theta": 100000.0},
          "layer_types": ["full_attention"]}
    cfg = {"speculators_model_type": "dflash", "draft_vocab_size": V,
           "aux_hidden_state_layer_ids": ids, "mask_token_id": 16, "block_size": 8,
           "sample_from_anchor": False, "sliding_window_non_causal": True,
           "transformer_layer_config": tl, "speculators_config": _envelope("dflash", 7)}
    d = _write(tmp_path / "dflash576", cfg, t)

    verifier = AutoModelForCausalLM.from_pretrained(vdir, dtype=torch.float32)
    prompt = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 3365, 3717, 25, 2]])
    with torch.no_grad():
        hs = verifier(prompt, output_hidden_states=True).hidden_states
    aux = torch.cat([hs[i] for i in ids], dim=-1)  # capture id i == HF hidden_states[i], i < N
    assert aux.abs().max() > 20  # real outlier channels

    ref = load_drafter(d, vdir)
    assert torch.equal(ref.lm_head.weight, ref.embed_tokens)  # tied verifier head
    low = load_drafter(d, vdir, dtype=torch.float16)
    tok = torch.cat([prompt, torch.tensor([[28]])], dim=1)
    a, b = ref.propose(tok, aux), low.propose(tok, aux)
    assert a.tokens.shape == (7,) and int(a.tokens.max()) < V
    assert torch.isfinite(b.logits).all()
    cos = torch.nn.functional.cosine_similarity(a.logits, b.logits.float(), dim=-1)
    assert cos.min() > 0.999
