"""DeepSeek DeepSpec DFlash release (external_formats.md §9, F7): anchor-first layout."""

from __future__ import annotations

import pytest

from fixtures_dflash import MASK, api_convert, cli_convert, codes, make_source, out_tensors, read

FMT = "deepspec_dflash"


def test_nonzero_markov_rank_is_not_deepspec_dflash(tmp_path):
    from specconv.convert import inspect_source

    src = make_source(tmp_path, FMT, config_updates={"markov_rank": 16})
    assert inspect_source(str(src)).format != FMT


@pytest.mark.parametrize("block", [4, 7])
def test_anchor_first(block, tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, block_size=block, verifier_dir=tiny_verifier_dir)
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["sample_from_anchor"] is True
    assert cfg["block_size"] == block
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == block
    assert cfg["mask_token_id"] == MASK
    assert "dflash-sample-from-anchor" in codes(rep.findings, "warning")  # vLLM DFlash rejects sfa=true


def test_minus_one_is_embeddings(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, target_layer_ids=(-1, 2, 5), verifier_dir=tiny_verifier_dir)
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["aux_hidden_state_layer_ids"] == [0, 3, 6]
    rec = read(tmp_path / "out", "specconv.json")["conversion"]["layer_ids"]
    assert rec["source_ids"] == [-1, 2, 5] and "-1" in rec["rule"]


def test_below_minus_one_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, target_layer_ids=(-2, 2, 5))
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and "-2" in rep["message"]


def test_minus_one_only_for_deepspec(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, "zlab_dflash", target_layer_ids=(-1, 2, 4))
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3


def test_embed_and_head_copies_kept(tmp_path, tiny_verifier_dir):
    from specconv.tensors import TensorStore

    src = make_source(tmp_path, FMT, verifier_dir=tiny_verifier_dir)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    t = out_tensors(out)
    assert t["embed_tokens.weight"].shape == (256, 64) and t["lm_head.weight"].shape == (256, 64)
    s, o = TensorStore.open(src), TensorStore.open(out)
    assert o.read_bytes("lm_head.weight") == s.read_bytes("lm_head.weight")
    assert read(out, "specconv.json")["conversion"]["tensors"]["embed_tokens.weight"]["fate"] == "copied"


def test_layout_flag_contradiction_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--no-sample-from-anchor")
    assert code == 3 and rep["error"] == "conflicting_layout"
    code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out2", "--sample-from-anchor")
    assert code == 0, err


def test_speculative_tokens_flag_contradiction_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, block_size=4)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--speculative-tokens", 3)
    assert code == 3 and rep["error"] == "conflicting_speculative_tokens"


def test_confidence_head_tensor_refused(tmp_path, tiny_verifier_dir):
    import torch

    src = make_source(tmp_path, FMT,
                      extra_tensors={"confidence_head.proj.weight": torch.zeros(1, 64, dtype=torch.bfloat16)})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and "confidence_head.proj.weight" in rep["message"]
