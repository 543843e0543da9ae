"""Muse-Glimmer assistant head (external_formats.md §3, F1b)."""

from __future__ import annotations

import pytest

from fixtures_dflash import MASK, api_convert, cli_convert, make_source, out_tensors, read

FMT = "muse_glimmer_dflash"


def test_encoder_renames_and_fates(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    names = set(out_tensors(out))
    assert {"fc.weight", "hidden_norm.weight"} <= names
    assert not any(n.startswith("encoder.") for n in names)
    fates = read(out, "specconv.json")["conversion"]["tensors"]
    assert fates["fc.weight"]["fate"] == "renamed" and fates["fc.weight"]["source"] == "encoder.fc.weight"
    assert fates["hidden_norm.weight"]["source"] == "encoder.output_norm_enc.weight"
    assert fates["norm.weight"]["fate"] == "copied"
    from specconv.tensors import TensorStore

    s, o = TensorStore.open(src), TensorStore.open(out)
    assert o.read_bytes("fc.weight") == s.read_bytes("encoder.fc.weight")
    assert o.read_bytes("hidden_norm.weight") == s.read_bytes("encoder.output_norm_enc.weight")


def test_flat_keys_and_non_causal(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, target_layer_ids=(0, 3, 5), block_size=6)
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["aux_hidden_state_layer_ids"] == [1, 4, 6]
    assert cfg["mask_token_id"] == MASK and cfg["block_size"] == 6
    assert cfg["sample_from_anchor"] is False
    # every layer runs non-causal in the source despite sliding layer_types
    assert cfg["transformer_layer_config"]["layer_types"] == ["sliding_attention"] * 2
    assert cfg["sliding_window_non_causal"] is True
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    assert "model_type" not in cfg


def test_unknown_encoder_tensor_refused(tmp_path, tiny_verifier_dir):
    import torch

    src = make_source(tmp_path, FMT, extra_tensors={"encoder.foo.weight": torch.zeros(3, dtype=torch.bfloat16)})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "refused_tensors" and "encoder.foo.weight" in rep["message"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["output_multiplier", "input_embedding_scale"])
def test_logit_scaling_refused(key, tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, config_updates={key: 2.0})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and key in rep["message"]


def test_neutral_scaling_accepted(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, config_updates={"output_multiplier": 1.0})
    code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 0, err
