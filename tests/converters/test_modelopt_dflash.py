"""NVIDIA ModelOpt DFlash export (external_formats.md §7, F5)."""

from __future__ import annotations

from fixtures_dflash import DELETE, api_convert, cli_convert, codes, make_source, read

FMT = "modelopt_dflash"


def test_convert(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT)
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert cfg["dtype"] == "bfloat16"  # from torch_dtype / the tensors
    t = cfg["transformer_layer_config"]
    assert t["rope_parameters"]["rope_theta"] == 1000000.0  # top-level rope_theta normalised, explicit
    assert "torch_dtype" not in t
    assert "modelopt-layer-id-convention" in codes(rep.findings, "warning")
    assert read(tmp_path / "out", "specconv.json")["conversion"]["format"] == FMT


def test_swa_non_causal(tmp_path, tiny_verifier_dir):
    upd = {"layer_types": ["sliding_attention"] * 2, "sliding_window": 16, "use_sliding_window": True,
           "dflash_config": {"use_swa": True, "swa_window_size": 16, "causal": False}}
    api_convert(make_source(tmp_path, FMT, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    assert read(tmp_path / "out")["sliding_window_non_causal"] is True


def test_use_swa_without_layer_types_refused(tmp_path, tiny_verifier_dir):
    upd = {"layer_types": DELETE, "sliding_window": 16, "dflash_config": {"use_swa": True}}
    code, rep, _ = cli_convert(make_source(tmp_path, FMT, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "missing_layer_types"


def test_quantized_export_not_converted_as_dflash(tmp_path, tiny_verifier_dir):
    upd = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}
    code, rep, _ = cli_convert(make_source(tmp_path, FMT, config_updates=upd), tiny_verifier_dir, tmp_path / "out")
    assert code == 3
    assert not (tmp_path / "out").exists()
