"""z-lab DFlash v1 (external_formats.md §3, F1): detection and mapping on spec-built fixtures."""

from __future__ import annotations

from fixtures_dflash import HUB, MASK, api_convert, cli_convert, codes, make_source, out_tensors, read


def inspect(src, verifier=None):
    from specconv.convert import inspect_source

    return inspect_source(str(src), verifier=str(verifier) if verifier else None, verifier_name=HUB)


def test_detected(tmp_path, tiny_verifier_dir):
    r = inspect(make_source(tmp_path), tiny_verifier_dir)
    assert (r.format, r.algorithm, r.supported) == ("zlab_dflash", "dflash", True)
    assert r.plan["config"]["aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert r.plan["fates"] == {"copied": len(out_tensors_of_source(tmp_path))}


def out_tensors_of_source(tmp_path):
    from safetensors import safe_open

    with safe_open(str(tmp_path / "zlab_dflash" / "model.safetensors"), "np") as f:
        return list(f.keys())


def test_projector_type_other_is_not_zlab(tmp_path):
    src = make_source(tmp_path, config_updates={"dflash_config": {"projector_type": "domino"}})
    assert inspect(src).format != "zlab_dflash"


def test_mapping(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, block_size=8, block_at="both", mask_at="both")
    out = tmp_path / "out"
    rep = api_convert(src, tiny_verifier_dir, out)
    cfg = read(out)
    assert cfg["block_size"] == 8 and cfg["mask_token_id"] == MASK
    assert cfg["sample_from_anchor"] is False
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    assert cfg["speculators_config"]["algorithm"] == "dflash"
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    t = cfg["transformer_layer_config"]
    assert "auto_map" not in t and "dflash_config" not in t and "dtype" not in t
    # tensor names already speculators names; no embed/lm_head added for z-lab input
    names = set(out_tensors(out))
    assert names == set(out_tensors_of_source(tmp_path))
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    assert not codes(rep.findings, "error")


def test_source_files_not_carried(tmp_path, tiny_verifier_dir):
    """dflash.py (auto_map remote code) is hashed as a source file but never published."""
    src = make_source(tmp_path)
    out = tmp_path / "out"
    api_convert(src, tiny_verifier_dir, out)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "specconv.json"]
    assert "dflash.py" in read(out, "specconv.json")["conversion"]["source"]["files"]


def test_attention_bias_tensors_accepted(tmp_path, tiny_verifier_dir):
    import torch

    extra = {f"layers.{i}.self_attn.{p}_proj.bias": torch.zeros(d, dtype=torch.bfloat16)
             for i in range(2) for p, d in (("q", 64), ("k", 32), ("v", 32), ("o", 64))}
    src = make_source(tmp_path, config_updates={"attention_bias": True}, extra_tensors=extra)
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert set(extra) <= set(out_tensors(tmp_path / "out"))
    assert read(tmp_path / "out")["transformer_layer_config"]["attention_bias"] is True


def test_missing_layer_tensor_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, drop_tensors=("layers.1.mlp.up_proj.weight",), layers=2)
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3


def test_layer_count_mismatch_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, config_updates={"num_hidden_layers": 3})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "layer_count_mismatch"
