"""NeMo Automodel DFlash (external_formats.md §8, F6)."""

from __future__ import annotations

from fixtures_dflash import api_convert, cli_convert, codes, make_source, read

FMT = "nemo_dflash"


def test_convert(tmp_path, tiny_verifier_dir):
    rep = api_convert(make_source(tmp_path, FMT), tiny_verifier_dir, tmp_path / "out")
    cfg = read(tmp_path / "out")
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 5] and cfg["sample_from_anchor"] is False
    assert "jetspec-unstamped" in codes(rep.findings)
    assert read(tmp_path / "out", "specconv.json")["conversion"]["format"] == FMT


def test_jetspec_causal_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT, config_updates={"dflash_config": {"causal": True}})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "unsupported_format" and "causal" in rep["message"]


def test_visual_fusion_refused_by_name(tmp_path, tiny_verifier_dir):
    import torch

    src = make_source(tmp_path, FMT, extra_tensors={"visual_fusion.gate": torch.zeros(1, dtype=torch.bfloat16)})
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and "visual_fusion.gate" in rep["message"]


def test_nemo_checkpoint_dir_layout(tmp_path, tiny_verifier_dir):
    """NeMo keeps the HF dir under epoch_E_step_S/model/ (or model/consolidated/)."""
    run = tmp_path / "run"
    make_source(tmp_path / "tmp", FMT).rename(tmp_path / "x")
    (run / "epoch_0_step_50" / "model").mkdir(parents=True)
    (tmp_path / "x").rename(run / "epoch_0_step_50" / "model" / "consolidated")
    rep = api_convert(run, tiny_verifier_dir, tmp_path / "out")
    assert rep.format == FMT
    assert rep.source.endswith("epoch_0_step_50/model/consolidated")
