"""deepspec_dspark: DeepSpec native DSpark (Qwen3DSparkModel, markov_rank > 0) → Speculators dspark.

Fixture: ``tests/fixtures_dspark.make_deepspec_dspark`` (spec-built, external_formats.md §9).
"""

from __future__ import annotations

import numpy as np
import pytest
from _dspark_helpers import detected, out_tensors, plan_for, record

from fixtures_dflash import cli_convert, read
from fixtures_dspark import draft_dims, make_deepspec_dspark
from specconv.errors import InvalidInputError, UnsupportedFormatError

FMT = "deepspec_dspark"  # the shared conversion tests read: conftest ``converted``


def test_convert_end_to_end(converted):
    cfg = read(converted.out)
    # -1 (embedding output) → 0; other ids +1
    assert cfg["aux_hidden_state_layer_ids"] == [0, 3, 5]
    # anchor-first: every slot drafts
    assert cfg["sample_from_anchor"] is True
    assert cfg["block_size"] == 4
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    for k in ("num_anchors", "markov_rank", "target_layer_ids", "mask_token_id", "num_target_layers"):
        assert k not in cfg["transformer_layer_config"], k


def test_every_tensor_copied_unchanged(converted):
    src, dst = out_tensors(converted.src), out_tensors(converted.out)
    assert set(dst) == set(src)  # names already match; embed_tokens/lm_head copies kept
    fates = record(converted.out)["tensors"]
    assert fates["markov_head.markov_w1.weight"]["fate"] == "copied"
    assert "equals the verifier" in fates["embed_tokens.weight"]["note"]


# ------------------------------------------------------------------ head-field rules
def test_markov_head_type_required_when_rank_positive(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, markov_head_type=None)
    with pytest.raises(InvalidInputError, match="markov_head_type"):
        plan_for(src, tiny_verifier_dir)


def test_markov_rank_missing_is_dspark_and_names_the_key(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, drop_keys=("markov_rank",))
    assert detected(src) == "deepspec_dspark"
    with pytest.raises(InvalidInputError, match="markov_rank"):
        plan_for(src, tiny_verifier_dir)


def test_markov_rank_zero_is_the_deepspec_dflash_release(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, markov_rank=0, enable_confidence_head=False)
    assert detected(src) == "deepspec_dflash"


def test_confidence_disabled_writes_with_markov_false(tmp_path, tiny_verifier_dir):
    # DeepSpec omits confidence_head_with_markov when the head is off; its model treats it as false
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, enable_confidence_head=False)
    cfg = __import__("json").loads((src / "config.json").read_text())
    assert "confidence_head_with_markov" not in cfg
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.enable_confidence_head is False
    assert plan.config.confidence_head_with_markov is False
    assert not [t for t in plan.tensors if t.out.startswith("confidence_head")]


def test_confidence_enabled_without_with_markov_key_is_an_error(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, confidence_head_with_markov=None,
                               tensor_heads={"with_markov": True})
    with pytest.raises(InvalidInputError, match="confidence_head_with_markov"):
        plan_for(src, tiny_verifier_dir)


def test_confidence_width_contradicting_config_names_tensor(tmp_path, tiny_verifier_dir):
    # config says with_markov, tensor is [1, H] (no Markov part)
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, tensor_heads={"with_markov": False})
    with pytest.raises(InvalidInputError,
                       match=r"confidence_head\.proj\.weight.*implies confidence_head_with_markov=false"):
        plan_for(src, tiny_verifier_dir)


def test_gated_head_tensors_carried(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, markov_head_type="gated")
    _, plan = plan_for(src, tiny_verifier_dir)
    outs = {t.out: t.shape for t in plan.tensors}
    H, r = draft_dims(tiny_verifier_dir)["H"], 8
    assert outs["markov_head.gate_proj.weight"] == (r, H + r)
    assert plan.config.markov_head_type == "gated"


def test_head_tensors_of_another_type_are_refused(tmp_path, tiny_verifier_dir):
    # config vanilla, weights gated
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, tensor_heads={"mtype": "gated"})
    with pytest.raises(InvalidInputError, match=r"markov_head_type=vanilla.*gate_proj"):
        plan_for(src, tiny_verifier_dir)


def test_missing_markov_tensor_is_an_error(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, drop_tensors=("markov_head.markov_w2.weight",))
    with pytest.raises(InvalidInputError, match=r"markov_head\.markov_w2\.weight"):
        plan_for(src, tiny_verifier_dir)


# ------------------------------------------------------------------------ layout rules
def test_without_deepspec_signature_layout_must_be_given(tmp_path, tiny_verifier_dir):
    # an SGLang-normalised SpecForge export looks like Qwen3DSparkModel but is 1+N
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, embed=False, drop_keys=("num_anchors",))
    with pytest.raises(InvalidInputError, match="block layout cannot be told") as e:
        plan_for(src, tiny_verifier_dir)
    assert e.value.code == "ambiguous_layout"
    assert "--no-sample-from-anchor" in e.value.hint
    _, plan = plan_for(src, tiny_verifier_dir, sample_from_anchor=False)
    assert plan.config.sample_from_anchor is False
    assert plan.config.speculators_config.proposal_methods[0].speculative_tokens == 3
    assert any(f.code == "layout-from-flag" for f in plan.findings)


def test_flag_contradicting_deepspec_layout_is_refused(converted, tiny_verifier_dir, tmp_path):
    code, rep, err = cli_convert(converted.src, tiny_verifier_dir, tmp_path / "o", "--no-sample-from-anchor")
    assert code == 3
    assert rep["error"] == "conflicting_layout"
    assert not (tmp_path / "o").exists()


def test_attn_output_gate_refused(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, extra_cfg={"attn_output_gate": True})
    with pytest.raises(UnsupportedFormatError, match="attn_output_gate"):
        plan_for(src, tiny_verifier_dir)


def test_target_layer_id_out_of_verifier_range(tmp_path, tiny_verifier_dir):
    src = make_deepspec_dspark(tmp_path / "s", tiny_verifier_dir, target_layer_ids=(-1, 2, 6))
    with pytest.raises(InvalidInputError, match="outside"):
        plan_for(src, tiny_verifier_dir)


# --------------------------------------------------------------------- vocab pruning
def _mapping_file(path, V=256, Vd=64, seed=0):
    rng = np.random.default_rng(seed)
    tgt = np.sort(np.concatenate([[0, 1], rng.choice(np.arange(2, V), Vd - 2, replace=False)])).astype(np.int64)
    d2t = tgt - np.arange(Vd)
    t2d = np.zeros(V, dtype=bool)
    t2d[tgt] = True
    np.savez(path, d2t=d2t, t2d=t2d)
    return path, tgt


def test_vocab_mapping_slices_markov_w2_and_lm_head_not_markov_w1(converted, tiny_verifier_dir, tmp_path):
    mp, tgt = _mapping_file(tmp_path / "vocab.npz")
    out = tmp_path / "pruned"
    code, rep, err = cli_convert(converted.src, tiny_verifier_dir, out, "--vocab-mapping", mp)
    assert code == 0, err
    cfg, src, dst = read(out), out_tensors(converted.src), out_tensors(out)
    assert cfg["draft_vocab_size"] == 64
    assert tuple(dst["markov_head.markov_w2.weight"].shape) == (64, 8)
    assert bool((dst["markov_head.markov_w2.weight"] == src["markov_head.markov_w2.weight"][tgt]).all())
    assert bool((dst["lm_head.weight"] == src["lm_head.weight"][tgt]).all())
    assert bool((dst["markov_head.markov_w1.weight"] == src["markov_head.markov_w1.weight"]).all())  # target-indexed
    assert tuple(dst["embed_tokens.weight"].shape) == (256, 64)
    assert dst["d2t"].tolist() == (tgt - np.arange(64)).tolist()
    assert int(dst["t2d"].sum()) == 64
    fates = record(out)["tensors"]
    assert fates["markov_head.markov_w2.weight"]["fate"] == "sliced"
    assert any(f["code"] == "dspark-vocab-pruned" for f in rep["findings"])


@pytest.mark.peer
def test_pruned_output_loads_in_speculators(converted, tiny_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    mp, _ = _mapping_file(tmp_path / "vocab.npz")
    out = tmp_path / "pruned"
    assert cli_convert(converted.src, tiny_verifier_dir, out, "--vocab-mapping", mp)[0] == 0
    logits = run_speculators_forward(load_with_speculators(out, tiny_verifier_dir))
    assert logits.shape[-1] == 64


def test_deepspec_training_dir_picks_latest_step(tmp_path, tiny_verifier_dir):
    """DeepSpec ``ckpt_manager`` layout: ``step_<N>/`` (save_pretrained + train_config.py +
    training_state.rank{r}.pt) and a ``step_latest`` symlink; the optimizer pickles are never read."""
    import os

    exp = tmp_path / "exp"
    make_deepspec_dspark(exp / "step_50", tiny_verifier_dir)
    newest = make_deepspec_dspark(exp / "step_200", tiny_verifier_dir, block_size=6)
    for d in ("step_50", "step_200"):
        (exp / d / "train_config.py").write_text("block_size = 6\n")
        (exp / d / "training_state.rank0.pt").write_bytes(b"not a pickle: must never be loaded")
    os.symlink("step_50", exp / "step_latest")
    out = tmp_path / "o"
    code, rep, err = cli_convert(exp, tiny_verifier_dir, out)
    assert code == 0, err
    assert rep["source"] == str(newest)
    assert read(out)["block_size"] == 6
    assert "training_state.rank0.pt" in record(out)["source"]["files"]  # hashed for provenance only
