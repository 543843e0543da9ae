"""SpecForge legacy DFlash training dirs (external_formats.md §6.2, F4)."""

from __future__ import annotations

import shutil

from fixtures_dflash import api_convert, make_source, read

FMT = "specforge_dflash"


def test_training_state_never_read_nor_published(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, FMT)
    assert (src / "training_state.pt").read_bytes().startswith(b"not a pickle")  # unpickling would fail
    out = tmp_path / "out"
    rep = api_convert(src, tiny_verifier_dir, out)
    assert rep.format == FMT
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "specconv.json"]
    rec = read(out, "specconv.json")["conversion"]
    assert any("training_state.pt" in n for n in rec["notes"])
    assert read(out)["aux_hidden_state_layer_ids"] == [1, 3, 5]


def test_latest_epoch_selected_from_run_dir(tmp_path, tiny_verifier_dir):
    first = make_source(tmp_path, FMT, block_size=4)
    run = first.parent
    second = run / "epoch_3_step_900"
    shutil.copytree(first, second)
    cfg = read(second)
    cfg["block_size"] = 6
    import json

    (second / "config.json").write_text(json.dumps(cfg))
    (run / "epoch_2_step_1000").mkdir()  # epoch ranks before step: not the latest
    shutil.copytree(first, run / "epoch_2_step_1000", dirs_exist_ok=True)
    rep = api_convert(run, tiny_verifier_dir, tmp_path / "out")
    assert rep.source.endswith("epoch_3_step_900")
    assert read(tmp_path / "out")["block_size"] == 6
    assert any("epoch_3_step_900" in n for n in read(tmp_path / "out", "specconv.json")["conversion"]["notes"])
    rep = api_convert(run, tiny_verifier_dir, tmp_path / "out1", checkpoint="epoch_1_step_100")
    assert read(tmp_path / "out1")["block_size"] == 4


def test_plain_export_is_zlab(tmp_path):
    """Without the training-dir markers the same files are SpecForge's --to hf export = z-lab."""
    from specconv.convert import inspect_source

    src = make_source(tmp_path, FMT)
    flat = tmp_path / "export"
    flat.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(src / f, flat / f)
    assert inspect_source(str(flat)).format == "zlab_dflash"
