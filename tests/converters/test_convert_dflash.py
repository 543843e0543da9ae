"""DFlash-family conversion: the issue-2 "done" criteria as tests.

* Real input (``peer``): a z-lab checkpoint written by z-lab's own ``dflash`` package
  (``examples/zlab_dflash.py``) for the real SmolLM2-135M verifier → ``specconv convert``
  → loads in speculators 0.9.0 and its forward runs; compared with speculators' own
  DFlash converter (speculators_format.md §7), including the last-layer id it drops (§7.5).
* Rules on tiny spec-built sources (tests/fixtures_dflash.py) against the tiny Qwen3
  verifier: layer-id mapping, fc width, block size / mask token provenance, causality,
  tensor fates, dtype, sharding, determinism, atomic writes, specconv.json, config.json.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from fixtures_dflash import (
    DELETE,
    FORMATS,
    HUB,
    MASK,
    VERIFIER_LAYERS,
    VOCAB,
    H,
    api_convert,
    cli_convert,
    codes,
    make_source,
    out_tensors,
    read,
    sha_tree,
)


def _peer():
    pytest.importorskip("speculators")
    pytest.importorskip("loguru")


# ================================================== every DFlash source format (the registry's)
@pytest.mark.parametrize("fmt", FORMATS)
def test_detected(tmp_path, fmt):
    """Each format's own layout is detected as that format (deepspec_dflash before zlab_dflash,
    whose layout it extends), supported, algorithm dflash; format-specific detection rules
    stay in tests/converters/test_<format>.py."""
    from specconv.convert import inspect_source

    r = inspect_source(str(make_source(tmp_path, fmt)))
    assert (r.format, r.algorithm, r.supported) == (fmt, "dflash", True)


@pytest.mark.peer
@pytest.mark.parametrize("fmt", FORMATS)
def test_loads_in_speculators(fmt, tiny_verifier_dir, tmp_path):
    """Each format's conversion loads in speculators 0.9.0 with the block size, mask token and
    layout it was written with, and speculators' forward runs (2 blocks of draft logits over the
    vocabulary). The format's own values (DeepSpec anchor-first, ...) are asserted on its
    config.json in tests/converters/test_<format>.py."""
    _peer()
    from interop import load_with_speculators, run_speculators_forward

    out = tmp_path / "out"
    api_convert(make_source(tmp_path, fmt, block_size=5, verifier_dir=tiny_verifier_dir), tiny_verifier_dir, out)
    cfg = read(out)
    m = load_with_speculators(out, tiny_verifier_dir)
    assert m.block_size == 5 and m.config.mask_token_id == MASK
    assert m.config.sample_from_anchor is cfg["sample_from_anchor"]
    assert cfg["sliding_window_non_causal"] is True
    logits = run_speculators_forward(m, num_blocks=2)
    assert tuple(logits.shape) == (1, 10, VOCAB)


# ===================================================================== real input (peer)
@pytest.fixture(scope="module")
def zlab_real(tmp_path_factory):
    """z-lab checkpoints for SmolLM2 written by z-lab's dflash package: ids (1,14,27) and
    a variant reading the verifier's last decoder layer (1,14,29)."""
    pytest.importorskip("dflash")
    from examples.zlab_dflash import LAST_LAYER_TARGET_IDS, make_zlab_dflash

    root = tmp_path_factory.mktemp("zlab_real")
    return {
        "plain": make_zlab_dflash(root / "plain", target_layer_ids=(1, 14, 27)),
        "last": make_zlab_dflash(root / "last", target_layer_ids=LAST_LAYER_TARGET_IDS),
    }


@pytest.mark.slow
@pytest.mark.peer
@pytest.mark.parametrize("variant", ["plain", "last"])
def test_real_zlab_converts_and_runs_in_speculators(variant, zlab_real, smollm2_dir, tmp_path):
    _peer()
    from interop import load_with_speculators, run_speculators_forward
    from specconv.offline import SMOLLM2_HUB_ID

    out = tmp_path / "out"
    code, rep, err = cli_convert(zlab_real[variant], smollm2_dir, out, name=SMOLLM2_HUB_ID)
    assert code == 0, err
    assert rep["format"] == "zlab_dflash" and rep["algorithm"] == "dflash"
    cfg = read(out)
    want = [2, 15, 28] if variant == "plain" else [2, 15, 30]  # z-lab +1; 29 → 30 kept
    assert cfg["aux_hidden_state_layer_ids"] == want
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == SMOLLM2_HUB_ID
    assert out_tensors(out)["fc.weight"].shape == (576, 3 * 576)
    model = load_with_speculators(out, smollm2_dir)
    assert type(model).__name__ == "DFlashDraftModel"
    assert model.fc.weight.shape == (576, 3 * 576)
    logits = run_speculators_forward(model, num_blocks=2)
    assert tuple(logits.shape) == (1, 2 * 8, 49152)


@pytest.mark.slow
@pytest.mark.peer
def test_real_matches_speculators_converter(zlab_real, smollm2_dir, tmp_path):
    """Same z-lab input through speculators' own DFlash converter: body tensors are
    byte-identical, the config agrees on every value both define."""
    _peer()
    from speculators.convert.entrypoints import convert_model

    from specconv.tensors import TensorStore

    src = zlab_real["plain"]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    api_convert(src, smollm2_dir, ours, name=str(smollm2_dir))
    convert_model(model=str(src), verifier=str(smollm2_dir), algorithm="dflash", output_path=str(theirs))
    a, b = TensorStore.open(ours), TensorStore.open(theirs)
    assert a.names() == b.names()  # 0.9.0 writes the body only, so do we for z-lab input
    for n in a.names():
        assert a.info(n).dtype == b.info(n).dtype and a.info(n).shape == b.info(n).shape, n
        assert a.read_bytes(n) == b.read_bytes(n), f"{n} differs from speculators' conversion"
    ca, cb = read(ours), read(theirs)
    for k in ("aux_hidden_state_layer_ids", "block_size", "mask_token_id", "draft_vocab_size", "sample_from_anchor",
              "speculators_model_type"):
        assert ca[k] == cb[k], k
    pa, pb = ca["speculators_config"]["proposal_methods"][0], cb["speculators_config"]["proposal_methods"][0]
    assert pa["speculative_tokens"] == pb["speculative_tokens"] == 7
    ta, tb = ca["transformer_layer_config"], cb["transformer_layer_config"]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "rms_norm_eps", "layer_types", "model_type"):
        assert ta[k] == tb[k], k
    assert ta["rope_parameters"]["rope_theta"] == tb["rope_parameters"]["rope_theta"]
    # all-full draft: we record vLLM's reading (bidirectional) explicitly; speculators keeps the default
    assert ca["sliding_window_non_causal"] is True
    assert "model_type" not in ca and "model_type" not in cb


@pytest.mark.slow
@pytest.mark.peer
def test_real_last_layer_speculators_drops_we_keep(zlab_real, smollm2_dir, tmp_path):
    """speculators_format.md §7.5: speculators' converter drops aux id 30 (= num layers)
    and then fails on the wider fc.weight; specconv keeps it and stays consistent."""
    _peer()
    from speculators.convert.entrypoints import convert_model

    src = zlab_real["last"]
    with pytest.raises(RuntimeError, match="fc.weight"):
        convert_model(model=str(src), verifier=str(smollm2_dir), algorithm="dflash",
                      output_path=str(tmp_path / "theirs"))
    rep = api_convert(src, smollm2_dir, tmp_path / "ours")
    cfg = read(tmp_path / "ours")
    assert VERIFIER_LAYERS != 30 and cfg["aux_hidden_state_layer_ids"][-1] == 30
    assert len(cfg["aux_hidden_state_layer_ids"]) * 576 == out_tensors(tmp_path / "ours")["fc.weight"].shape[1]
    assert "aux-ids-final-hidden-state" in codes(rep.findings, "warning")


# ============================================================================ layer ids
@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_ids_plus_one(fmt, tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, fmt, target_layer_ids=(0, 2, 4), verifier_dir=tiny_verifier_dir)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    cfg = read(out)
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 5]
    rec = read(out, "specconv.json")["conversion"]["layer_ids"]
    assert rec["source_ids"] == [0, 2, 4] and rec["speculators_ids"] == [1, 3, 5]
    assert rec["source_convention"] == "z-lab" and "+1" in rec["rule"]
    assert rec["source_key"].endswith("target_layer_ids")


def test_last_layer_kept(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, target_layer_ids=(0, 2, VERIFIER_LAYERS - 1))
    out = tmp_path / "out"
    rep = api_convert(src, tiny_verifier_dir, out)
    assert read(out)["aux_hidden_state_layer_ids"] == [1, 3, VERIFIER_LAYERS]
    assert out_tensors(out)["fc.weight"].shape == (H, 3 * H)
    # one finding about it, the lint's: only some engine versions capture the final state
    # (an info saying "vLLM can capture it" contradicted it; issue 14 item 10)
    last = [f for f in rep.findings if str(VERIFIER_LAYERS) in f["message"] and "final" in f["message"]]
    assert [f["code"] for f in last] == ["aux-ids-final-hidden-state"] and last[0]["level"] == "warning"
    assert "PR #36063" in last[0]["message"]


@pytest.mark.peer
def test_last_layer_output_runs_in_speculators(tiny_verifier_dir, tmp_path):
    _peer()
    from interop import load_with_speculators, run_speculators_forward

    src = make_source(tmp_path, target_layer_ids=(0, 2, VERIFIER_LAYERS - 1))
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    m = load_with_speculators(tmp_path / "out", tiny_verifier_dir)
    assert m.config.aux_hidden_state_layer_ids == [1, 3, VERIFIER_LAYERS]
    run_speculators_forward(m)


def test_layer_id_beyond_verifier_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, target_layer_ids=(0, 2, VERIFIER_LAYERS))  # → 7 > 6
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "layer_ids_out_of_range"
    assert not (tmp_path / "out").exists()


def test_fc_width_mismatch_names_both_numbers(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, target_layer_ids=(0, 2, 4), fc_in=2 * H)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "fc_width_mismatch" and rep["exit_code"] == 3
    assert str(2 * H) in rep["message"] and str(3 * H) in rep["message"]
    assert not (tmp_path / "out").exists()


def test_missing_layer_ids_then_override(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, target_layer_ids=None)
    out = tmp_path / "out"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out)
    assert code == 3 and rep["error"] == "missing_layer_ids"
    assert "--aux-layer-ids" in rep.get("hint", "") + err
    assert not out.exists()
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--aux-layer-ids", "1,3,5")
    assert code == 0, err
    assert read(out)["aux_hidden_state_layer_ids"] == [1, 3, 5]
    rec = read(out, "specconv.json")["conversion"]
    assert rec["options"]["aux_layer_ids"] == [1, 3, 5]
    assert rec["layer_ids"]["source_convention"] == "override" and rec["layer_ids"]["source_ids"] is None


def test_aux_override_of_checkpoint_ids_warns(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, target_layer_ids=(0, 2, 4))
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out", aux_layer_ids=[2, 3, 6])
    assert read(tmp_path / "out")["aux_hidden_state_layer_ids"] == [2, 3, 6]
    assert "aux-ids-override" in codes(rep.findings, "warning")


# ================================================================ block size / mask token
@pytest.mark.parametrize("block_at", ["top", "nested", "both"])
def test_block_size_locations(block_at, tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, block_size=6, block_at=block_at)
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["block_size"] == 6
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5


def test_block_size_disagreement_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, block_size=4, block_at="top", config_updates={"dflash_config": {"block_size": 8}})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "conflicting_keys"
    assert "block_size=4" in rep["message"] and "dflash_config.block_size=8" in rep["message"]


def test_missing_block_size_never_defaulted(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, block_size=None)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "missing_block_size"
    assert not (tmp_path / "out").exists()


def test_mask_token_disagreement_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, mask_token_id=MASK, mask_at="nested", config_updates={"mask_token_id": MASK + 1})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "conflicting_keys"
    assert str(MASK) in rep["message"] and str(MASK + 1) in rep["message"]


@pytest.mark.parametrize("mask_at", ["nested", "top", "both"])
def test_mask_token_locations(mask_at, tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, mask_at=mask_at)
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["mask_token_id"] == MASK


def test_mask_token_from_flag_when_absent(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, mask_token_id=None)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "o1")
    assert code == 3 and rep["error"] == "missing_mask_token" and "--mask-token-id" in rep["hint"]
    code, rep, err = cli_convert(src, tiny_verifier_dir, tmp_path / "o2", "--mask-token-id", 123)
    assert code == 0, err
    assert read(tmp_path / "o2")["mask_token_id"] == 123
    rec = read(tmp_path / "o2", "specconv.json")["conversion"]
    assert rec["options"]["mask_token_id"] == 123
    assert any("--mask-token-id" in n for n in rec["notes"])


def test_mask_flag_agreeing_with_checkpoint_ok(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--mask-token-id", MASK)
    assert code == 0, err


def test_mask_flag_contradicting_checkpoint_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--mask-token-id", MASK + 5)
    assert code == 3 and rep["error"] == "conflicting_mask_token"
    assert str(MASK) in rep["message"] and str(MASK + 5) in rep["message"]


def _mask_findings(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f.get("key") == "mask_token_id" or "mask" in f["code"]]


def test_mask_equal_to_eos_warns_once(tiny_verifier_dir, tmp_path):
    """One warning (the lint's mask-token-special), not a converter copy beside it."""
    src = make_source(tmp_path, mask_token_id=2)  # tiny verifier eos = 2
    code, rep, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 0, err
    w = _mask_findings(rep["findings"])
    assert [f["code"] for f in w] == ["mask-token-special"], w
    assert w[0]["level"] == "warning" and "eos" in w[0]["message"]
    recorded = read(tmp_path / "out", "specconv.json")["conversion"]["findings"]
    assert [f["code"] for f in _mask_findings(recorded)] == ["mask-token-special"]


def test_mask_equal_to_a_later_eos_id_warns(tiny_verifier_dir, tmp_path):
    """An eos list: every id counts, not only the first (the converter's check read eos[0])."""
    import shutil

    v = tmp_path / "verifier"
    shutil.copytree(tiny_verifier_dir, v)
    cfg = read(v)
    cfg["eos_token_id"] = [2, 7]
    (v / "config.json").write_text(json.dumps(cfg))
    src = make_source(tmp_path, mask_token_id=7)
    code, rep, err = cli_convert(src, v, tmp_path / "out")
    assert code == 0, err
    w = _mask_findings(rep["findings"])
    assert [f["code"] for f in w] == ["mask-token-special"] and "eos" in w[0]["message"]


def test_mask_outside_vocab_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, mask_token_id=256)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "mask_token_out_of_vocab"


# ================================================================== tensors: never silent


@pytest.mark.parametrize("fmt", FORMATS)
def test_unknown_tensor_refused_by_name(fmt, tiny_verifier_dir, tmp_path):
    import torch

    src = make_source(tmp_path, fmt, extra_tensors={"mystery_head.weight": torch.zeros(4, 4, dtype=torch.bfloat16)})
    out = tmp_path / "out"
    code, rep, _ = cli_convert(src, tiny_verifier_dir, out)
    assert code == 3 and rep["error"] == "refused_tensors"
    assert "mystery_head.weight" in rep["message"]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_all_refused_tensors_listed(tiny_verifier_dir, tmp_path):
    import torch

    src = make_source(tmp_path, extra_tensors={"a.weight": torch.zeros(2, dtype=torch.bfloat16),
                                               "layers.0.mlp.router.weight": torch.zeros(4, dtype=torch.bfloat16)})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3
    assert "a.weight" in rep["message"] and "layers.0.mlp.router.weight" in rep["message"]


def test_rotary_inv_freq_dropped_with_reason(tiny_verifier_dir, tmp_path):
    import torch

    src = make_source(tmp_path, extra_tensors={"rotary_emb.inv_freq": torch.ones(8)})
    out = tmp_path / "out"
    rep = api_convert(src, tiny_verifier_dir, out)
    assert "rotary_emb.inv_freq" not in out_tensors(out)
    fates = read(out, "specconv.json")["conversion"]["tensors"]
    d = [v for v in fates.values() if v.get("fate") == "dropped"]
    assert len(d) == 1 and d[0]["name"] == "rotary_emb.inv_freq" and "rope" in d[0]["reason"].lower()
    assert [x["name"] for x in rep.plan["dropped"]] == ["rotary_emb.inv_freq"]


def test_every_source_tensor_has_a_fate(tiny_verifier_dir, tmp_path):
    from safetensors import safe_open

    src = make_source(tmp_path)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    with safe_open(str(src / "model.safetensors"), "np") as f:
        src_names = set(f.keys())
    fates = read(out, "specconv.json")["conversion"]["tensors"]
    accounted = {v["source"] for v in fates.values() if v.get("source")} | {
        v["name"] for v in fates.values() if v.get("fate") == "dropped"}
    assert src_names <= accounted
    assert set(out_tensors(out)) == {k for k, v in fates.items() if v.get("fate") != "dropped"}
    assert all(v["fate"] == "copied" for k, v in fates.items() if not k.startswith("<dropped>"))


# ============================================================================ causality
def _swa(kinds):
    return {"layer_types": kinds, "sliding_window": 16, "use_sliding_window": True, "max_window_layers": 0}


def test_all_full_attention_is_non_causal(tiny_verifier_dir, tmp_path):
    api_convert(make_source(tmp_path), tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["sliding_window_non_causal"] is True


def test_all_swa_is_causal(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, config_updates=_swa(["sliding_attention"] * 2))
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["sliding_window_non_causal"] is False
    assert cfg["transformer_layer_config"]["layer_types"] == ["sliding_attention"] * 2
    assert not codes(rep.findings, "error")


def test_mixed_attention_warns(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, config_updates=_swa(["sliding_attention", "full_attention"]))
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["sliding_window_non_causal"] is False
    assert "mixed-attention-layers" in codes(rep.findings, "warning")


@pytest.mark.parametrize("where", ["top", "nested"])
def test_explicit_non_causal_swa(where, tiny_verifier_dir, tmp_path):
    upd = _swa(["sliding_attention"] * 2)
    upd.update({"is_causal": False} if where == "top" else {"dflash_config": {"causal": False}})
    api_convert(make_source(tmp_path, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["sliding_window_non_causal"] is True


@pytest.mark.parametrize("where", ["top", "nested"])
def test_causal_dflash_refused(where, tiny_verifier_dir, tmp_path):
    upd = {"is_causal": True} if where == "top" else {"dflash_config": {"causal": True}}
    code, rep, _ = cli_convert(make_source(tmp_path, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "unsupported_format"
    assert "causal" in rep["message"]
    assert not (tmp_path / "out").exists()


def test_causality_keys_disagree_refused(tiny_verifier_dir, tmp_path):
    upd = {"is_causal": False, "dflash_config": {"causal": True}}
    code, rep, _ = cli_convert(make_source(tmp_path, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    # either the causal-DFlash refusal (detected first) or the disagreement itself
    assert code == 3 and rep["error"] in ("conflicting_keys", "unsupported_format") and "causal" in rep["message"]


# ============================================================== dtype / shards / determinism
def test_dtype_float32_cast(tiny_verifier_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    src = make_source(tmp_path)
    out = tmp_path / "out"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--dtype", "float32")
    assert code == 0, err
    a, b = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(a) == set(b)
    for n, t in a.items():
        assert b[n].dtype == torch.float32, n
        assert torch.equal(b[n], t.to(torch.float32)), n
    assert read(out)["dtype"] == "float32"
    rec = read(out, "specconv.json")["conversion"]
    assert rec["dtype"] == "float32" and rec["options"]["dtype"] == "float32"
    assert rec["tensors"]["fc.weight"]["cast_from"] == "BF16" and rec["tensors"]["fc.weight"]["dtype"] == "F32"


def test_dtype_keep(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, dtype="float16")
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert {i.dtype for i in out_tensors(tmp_path / "out").values()} == {"F16"}
    assert read(tmp_path / "out")["dtype"] == "float16"


def test_max_shard_size_shards_and_index(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    out = tmp_path / "out"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--max-shard-size", "40KB")
    assert code == 0, err
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and not (out / "model.safetensors").exists()
    index = read(out, "model.safetensors.index.json")
    assert sorted(set(index["weight_map"].values())) == shards
    single = tmp_path / "single"
    api_convert(src, tiny_verifier_dir, single)
    from specconv.tensors import TensorStore

    a, b = TensorStore.open(out), TensorStore.open(single)
    assert a.names() == b.names() == sorted(index["weight_map"])
    assert all(a.read_bytes(n) == b.read_bytes(n) for n in a.names())
    assert sorted(read(out, "specconv.json")["conversion"]["output_files"]) == sorted(p.name for p in out.iterdir())


@pytest.mark.peer
def test_sharded_output_loads_in_speculators(tiny_verifier_dir, tmp_path):
    _peer()
    from interop import load_with_speculators, run_speculators_forward

    src = make_source(tmp_path)
    api_convert(src, tiny_verifier_dir, tmp_path / "out", max_shard_size=40_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    run_speculators_forward(load_with_speculators(tmp_path / "out", tiny_verifier_dir))


@pytest.mark.parametrize("shard", [None, 40_000])
def test_byte_identical_reruns(shard, tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    api_convert(src, tiny_verifier_dir, tmp_path / "a" / "out", max_shard_size=shard)
    api_convert(src, tiny_verifier_dir, tmp_path / "b" / "out", max_shard_size=shard)
    a, b = sha_tree(tmp_path / "a" / "out"), sha_tree(tmp_path / "b" / "out")
    assert a == b and "specconv.json" in a and "config.json" in a and "README.md" in a  # the card too (same dir name)


# ============================================================== dry run / overwrite / atomic
def test_dry_run_writes_nothing(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path / "src")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, rep, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--dry-run")
    assert code == 0, err
    assert rep["dry_run"] is True and rep["plan"]["config"]["mask_token_id"] == MASK
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    code, rep, err = cli_convert(src, tiny_verifier_dir, None, "--dry-run")  # -o optional
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _output_warnings(rep: dict) -> list[str]:
    return [f["message"] for f in rep["findings"] if f["code"] == "output-exists"]


def test_dry_run_tells_the_overwrite_truth(tiny_verifier_dir, tmp_path):
    """The dry run's ``output-exists`` warning says what the real run would do: need
    ``--overwrite`` for specconv's own output, refuse a user's dir even with it (never suggest
    a flag that would be refused: ``outdir.check_replaceable`` decides both)."""
    src = make_source(tmp_path / "src")
    out = tmp_path / "out"
    assert cli_convert(src, tiny_verifier_dir, out)[0] == 0
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--dry-run")
    assert code == 0, err
    assert [m for m in _output_warnings(rep) if "needs --overwrite" in m] == _output_warnings(rep) != []
    assert _output_warnings(cli_convert(src, tiny_verifier_dir, out, "--dry-run", "--overwrite")[1]) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    for flags in (("--dry-run",), ("--dry-run", "--overwrite")):
        code, rep, err = cli_convert(src, tiny_verifier_dir, mine, *flags)
        assert code == 0, err
        (msg,) = _output_warnings(rep)
        assert "with or without --overwrite" in msg and "notes.txt" in msg and "needs --overwrite" not in msg
        assert cli_convert(src, tiny_verifier_dir, mine, *flags[1:])[0] == 3  # the real run refuses it
    assert (mine / "notes.txt").read_text() == "a user's file"


def test_missing_output_without_dry_run_is_usage_error(tiny_verifier_dir, tmp_path):
    code, rep, _ = cli_convert(make_source(tmp_path), tiny_verifier_dir, None)
    assert code == 2 and rep["exit_code"] == 2


def test_existing_output_needs_overwrite(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, first, _ = cli_convert(src, tiny_verifier_dir, out)
    assert code == 3 and first["error"] == "output_exists"
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    code, rep, _ = cli_convert(src, tiny_verifier_dir, out, "--overwrite")  # not specconv's: never replaced
    assert code == 3 and rep["error"] == "output_exists" and "keep.txt" in rep["message"]
    # so the first refusal says that, not "pass --overwrite" (which would be refused)
    assert (first["message"], first.get("hint")) == (rep["message"], rep.get("hint"))
    assert "--overwrite" not in first["message"] + first.get("hint", "")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    code, rep, err = cli_convert(src, tiny_verifier_dir, out)  # into the empty dir: still needs --overwrite
    assert code == 3 and rep["error"] == "output_exists"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--overwrite")
    assert code == 0, err
    assert (out / "config.json").is_file()
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--overwrite")  # its own earlier output
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "zlab_dflash"]


@pytest.mark.parametrize("existing", [False, True])
def test_failing_write_leaves_nothing(existing, tiny_verifier_dir, tmp_path, monkeypatch):
    import specconv.tensors as tensors_mod

    src = make_source(tmp_path / "src")
    parent = tmp_path / "outs"
    parent.mkdir()
    out = parent / "out"
    if existing:  # an earlier conversion (of another source): what --overwrite may replace
        api_convert(make_source(tmp_path / "earlier", seed=1), tiny_verifier_dir, out)
        before = sha_tree(out)
    real = tensors_mod.write_safetensors

    def broken(d, *a, **k):
        real(d, *a, **k)  # the shards are on disk when the failure hits
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(tensors_mod, "write_safetensors", broken)
    from specconv.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="disk full") as e:  # the OS error, naming the output (exit 3)
        api_convert(src, tiny_verifier_dir, out, overwrite=existing)
    assert e.value.code == "os_error" and str(out) in e.value.message
    left = sorted(p.name for p in parent.iterdir())
    if existing:
        assert left == ["out"] and sha_tree(out) == before
    else:
        assert left == []


def test_output_inside_source_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, src / "converted")
    assert code == 3
    assert not (src / "converted").exists()


# ========================================================== specconv.json / config.json
def test_specconv_json_record(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    rec = read(out, "specconv.json")["conversion"]
    assert rec["format"] == "zlab_dflash" and rec["algorithm"] == "dflash"
    src_files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    assert sorted(rec["source"]["files"]) == src_files
    for f in ("model.safetensors", "config.json"):
        assert rec["source"]["files"][f] == hashlib.sha256((src / f).read_bytes()).hexdigest()
    tensors = rec["tensors"]
    assert set(out_tensors(out)) <= set(tensors)
    fc = tensors["fc.weight"]
    assert fc["fate"] == "copied" and fc["source"] == "fc.weight" and fc["shape"] == [H, 3 * H]
    assert rec["layer_ids"] == {
        "source_key": "dflash_config.target_layer_ids", "source_convention": "z-lab",
        "source_ids": [0, 2, 4], "speculators_ids": [1, 3, 5], "rule": rec["layer_ids"]["rule"]}
    assert rec["dtype"] == "bfloat16"
    assert rec["verifier"]["name_or_path"] == HUB and rec["verifier"]["num_hidden_layers"] == VERIFIER_LAYERS
    v = rec["versions"]
    import safetensors

    import specconv

    assert v["specconv"] == specconv.__version__ and v["safetensors"] == safetensors.__version__
    assert sorted(rec["output_files"]) == sorted(p.name for p in out.iterdir())


def test_config_json_meaning_bearing_keys(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, block_size=5)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    cfg = read(out)
    assert "model_type" not in cfg
    assert cfg["speculators_model_type"] == "dflash"
    assert cfg["mask_token_id"] == MASK
    assert cfg["block_size"] == 5
    assert cfg["sample_from_anchor"] is False
    assert cfg["sliding_window_non_causal"] is True
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert cfg["draft_vocab_size"] == 256
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == HUB
    t = cfg["transformer_layer_config"]
    assert t["rope_parameters"]["rope_theta"] == 1000000.0
    assert t["model_type"] == "qwen3" and t["num_hidden_layers"] == 2 and t["vocab_size"] == 256
    for k in ("dflash_config", "auto_map", "block_size", "num_target_layers", "architectures", "mask_token_id"):
        assert k not in t, k
    # deterministic dump: sorted keys, trailing newline
    text = (out / "config.json").read_text()
    assert text.endswith("\n") and list(json.loads(text)) == sorted(json.loads(text))


def test_rope_theta_written_explicitly_from_top_level(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, config_updates={"rope_parameters": DELETE, "rope_theta": 500000.0})
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    t = read(tmp_path / "out")["transformer_layer_config"]
    assert t["rope_parameters"]["rope_theta"] == 500000.0


def test_missing_rope_theta_refused(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, config_updates={"rope_parameters": DELETE})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "missing_rope_theta"


def test_verifier_hidden_mismatch_refused(tiny_verifier_dir, tmp_path):
    from conftest import make_tiny_verifier

    other = make_tiny_verifier(tmp_path / "v32", hidden_size=32, heads=2, kv_heads=1)
    code, rep, _ = cli_convert(make_source(tmp_path), other, tmp_path / "out")
    assert code == 3 and rep["error"] == "verifier_mismatch"
    assert "64" in rep["message"] and "32" in rep["message"]


def test_file_modes_normal(tiny_verifier_dir, tmp_path):
    out = tmp_path / "out"
    api_convert(make_source(tmp_path), tiny_verifier_dir, out)
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~umask
    assert all((p.stat().st_mode & 0o777) == 0o666 & ~umask for p in out.iterdir())
