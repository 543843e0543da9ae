"""F11 speculators trainer output ("normalise, don't convert") and F10 early P-EAGLE branches.

The checkpoints are written by speculators 0.9.0 itself (``from_training_args`` +
``save_pretrained`` on tiny local verifiers) into a trainer ``save_path`` layout
(``<epoch>/`` dirs with optimizer/scheduler/training files, ``checkpoint_best`` and
``epoch<E>_end`` symlinks, ``interrupted/``; speculators ``train/checkpointer.py``).
Legacy variants patch the config the way older speculators versions wrote it
(external_formats.md §12–§13).
"""

from __future__ import annotations

import json

import pytest

import fixtures_peagle as fp

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")
pytest.importorskip("loguru")

HUB = "org/tiny"


def convert(src, verifier, out=None, **opts):
    from specconv.convert import convert as _convert
    from specconv.converters import ConvertOptions

    return _convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                    verifier_name=HUB, dry_run=out is None)


def codes(rep, level=None):
    return {f["code"] for f in rep.findings if level is None or f["level"] == level}


def tensors_equal(a, b):
    import torch

    ta, tb = fp.load_tensors(a), fp.load_tensors(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k


@pytest.fixture(scope="module")
def peagle_epochs(tiny_llama_verifier_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("pe")
    return {e: fp.build_speculators_peagle(tiny_llama_verifier_dir, d / str(e), vd=64, dtype="bfloat16", seed=10 + e)
            for e in range(3)}


@pytest.fixture(scope="module")
def dflash_ref(tiny_verifier_dir, tmp_path_factory):
    return fp.build_speculators_block(tiny_verifier_dir, tmp_path_factory.mktemp("df") / "dflash", "dflash")


@pytest.fixture(scope="module")
def dspark_refs(tiny_verifier_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    return {
        "sfa": fp.build_speculators_block(tiny_verifier_dir, d / "sfa", "dspark", vd=64, sample_from_anchor=True),
        "1n": fp.build_speculators_block(tiny_verifier_dir, d / "1n", "dspark", sample_from_anchor=False, seed=1),
    }


# -------------------------------------------------------------------------- P-EAGLE
def test_peagle_save_dir_best_latest_named(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    save = fp.trainer_save_dir(tmp_path / "save", peagle_epochs, best=1, interrupted=peagle_epochs[0])
    out = tmp_path / "out"
    rep = convert(save, tiny_llama_verifier_dir, out)
    assert rep.format == "speculators_peagle"
    assert rep.source.endswith("/save/1")  # checkpoint_best → 1, not the latest (2)
    assert any("checkpoint_best → 1" in n for n in rep.plan["notes"])
    tensors_equal(out, peagle_epochs[1])
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "specconv.json"]
    notes = " ".join(rep.plan["notes"])
    for f in ("optimizer_state_dict.pt", "scheduler_state_dict.pt", "training_state.json", "val_metrics.json",
              "train_command.txt"):
        assert f in notes
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert set(rec["source"]["files"]) == {"config.json", "model.safetensors"}  # training files not even hashed
    assert {v["fate"] for v in rec["tensors"].values()} == {"copied"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == HUB
    assert cfg["dtype"] == "bfloat16" and "auto_map" not in cfg
    run_speculators_forward(load_with_speculators(out, tiny_llama_verifier_dir))
    assert convert(save, tiny_llama_verifier_dir, checkpoint="latest").source.endswith("/save/2")
    assert convert(save, tiny_llama_verifier_dir, checkpoint="0").source.endswith("/save/0")
    assert convert(save, tiny_llama_verifier_dir, checkpoint="interrupted").source.endswith("/save/interrupted")
    save2 = fp.trainer_save_dir(tmp_path / "save2", peagle_epochs)  # no validation → no checkpoint_best
    assert convert(save2, tiny_llama_verifier_dir).source.endswith("/save2/2")


def test_sharded_epoch_dir_accepted(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    save = fp.trainer_save_dir(tmp_path / "save", {0: peagle_epochs[0]})
    t = fp.load_tensors(save / "0")
    (save / "0" / "model.safetensors").unlink()
    fp.save_tensors(save / "0", t, shards=3)  # save_pretrained above max_shard_size (external_formats.md §13)
    out = tmp_path / "out"
    rep = convert(save, tiny_llama_verifier_dir, out)
    assert rep.format == "speculators_peagle"
    tensors_equal(out, peagle_epochs[0])


def test_peagle_dtype_and_speculative_tokens(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    save = fp.trainer_save_dir(tmp_path / "save", {0: peagle_epochs[0]}, config_patch={"num_depths": 4})
    rep = convert(save, tiny_llama_verifier_dir, dtype="float32", speculative_tokens=3)
    cfg = rep.plan["config"]
    assert cfg["dtype"] == "float32" and cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    with pytest.raises(InvalidInputError, match="exceeds the 4 depths"):
        convert(save, tiny_llama_verifier_dir, speculative_tokens=5)


def test_invalid_vocab_mapping_refused(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    from safetensors.torch import save_file

    from specconv.errors import InvalidInputError

    save = fp.trainer_save_dir(tmp_path / "save", {0: peagle_epochs[0]})
    t = fp.load_tensors(save / "0")
    t["d2t"][5] += 1  # draft 5 now lands on a target t2d does not mark
    save_file(t, str(save / "0" / "model.safetensors"))
    with pytest.raises(InvalidInputError) as e:
        convert(save, tiny_llama_verifier_dir)
    assert e.value.code in ("vocab_map_invalid",)


def test_layer_config_filled_from_transformers_defaults(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    save = fp.trainer_save_dir(tmp_path / "save", {0: peagle_epochs[0]})
    cfg = fp.read_json(save / "0" / "config.json")
    for k in ("rms_norm_eps", "head_dim", "rope_parameters"):
        cfg["transformer_layer_config"].pop(k)
    fp.write_json(save / "0" / "config.json", cfg)
    rep = convert(save, tiny_llama_verifier_dir)
    tl = rep.plan["config"]["transformer_layer_config"]
    from transformers import LlamaConfig

    d = LlamaConfig()
    assert tl["rms_norm_eps"] == d.rms_norm_eps and tl["head_dim"] == 16
    assert tl["rope_parameters"]["rope_theta"] == d.rope_parameters["rope_theta"]
    assert any("filled" in n and "rms_norm_eps" in n for n in rep.plan["notes"])


# -------------------------------------------------------------------------- F10
def test_early_peagle_ptd_token_and_para_num(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    src = fp.to_early_speculators(peagle_epochs[2], tmp_path / "early", para_num=6)
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out)
    assert rep.format == "speculators_peagle_early"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mask_token_id"] == fp.MASK and "ptd_token_id" not in cfg
    assert cfg["num_depths"] == 6 and "para_num" not in cfg
    for k in ("down_sample_ratio", "down_sample_ratio_min", "loss_type"):
        assert k not in cfg
    assert any("legacy ptd_token_id → mask_token_id" in n for n in rep.plan["notes"])
    tensors_equal(out, peagle_epochs[2])
    run_speculators_forward(load_with_speculators(out, tiny_llama_verifier_dir))


def test_early_peagle_disagreeing_depth_keys(peagle_epochs, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_early_speculators(peagle_epochs[2], tmp_path / "early")
    cfg = fp.read_json(src / "config.json")
    cfg["para_depths"] = cfg["para_num"] + 2
    fp.write_json(src / "config.json", cfg)
    with pytest.raises(InvalidInputError, match="para_num.*para_depths"):
        convert(src, tiny_llama_verifier_dir)
    cfg["para_depths"] = [0, 1, 2]
    fp.write_json(src / "config.json", cfg)
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir)
    assert e.value.code == "legacy_key_unknown"


# -------------------------------------------------------------------------- DFlash
def test_dflash_save_dir_legacy_sample_from_anchor(dflash_ref, tiny_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward
    from specconv.errors import InvalidInputError

    spec = fp.read_json(dflash_ref / "config.json")
    assert spec["sample_from_anchor"] is False
    save = fp.trainer_save_dir(tmp_path / "save", {0: dflash_ref}, best=0, config_patch={"max_anchors": 3072},
                               config_drop=("sample_from_anchor",))
    out = tmp_path / "out"
    rep = convert(save, tiny_verifier_dir, out)
    assert rep.format == "speculators_dflash"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sample_from_anchor"] is False and "max_anchors" not in cfg  # K == B-1 → 1+N
    assert "sample-from-anchor-filled" in codes(rep)
    assert any("max_anchors=3072 dropped" in n for n in rep.plan["notes"])
    tensors_equal(out, dflash_ref)
    run_speculators_forward(load_with_speculators(out, tiny_verifier_dir))
    with pytest.raises(InvalidInputError, match="contradicts the legacy rule"):
        convert(save, tiny_verifier_dir, sample_from_anchor=True)


def test_legacy_layout_undecidable(dflash_ref, tiny_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    spec = fp.read_json(dflash_ref / "config.json")
    sc = spec["speculators_config"]
    sc["proposal_methods"][0]["speculative_tokens"] = 2  # block 4: neither 3 nor 4
    save = fp.trainer_save_dir(tmp_path / "save", {0: dflash_ref}, config_patch={"speculators_config": sc},
                               config_drop=("sample_from_anchor",))
    with pytest.raises(InvalidInputError) as e:
        convert(save, tiny_verifier_dir)
    assert e.value.code == "missing_sample_from_anchor" and "--sample-from-anchor" in e.value.hint


# -------------------------------------------------------------------------- DSpark
@pytest.mark.parametrize("version,warned", [("0.6.1.dev40", True), ("0.7.0.dev80", True), ("0.7.0", False),
                                            ("0.9.0", False), (None, True)])
def test_dspark_markov_fix_warning(dspark_refs, tiny_verifier_dir, tmp_path, version, warned):
    patch = {"speculators_version": version} if version else {}
    save = fp.trainer_save_dir(tmp_path / "save", {0: dspark_refs["sfa"]}, config_patch=patch,
                               config_drop=() if version else ("speculators_version",))
    rep = convert(save, tiny_verifier_dir)
    assert ("dspark-markov-misaligned" in codes(rep, "warning")) is warned
    assert "#806" in json.dumps(rep.findings) or not warned


def test_dspark_end_to_end_and_legacy_anchor_first(dspark_refs, tiny_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    save = fp.trainer_save_dir(tmp_path / "save", {0: dspark_refs["sfa"]},
                               config_patch={"max_anchors": 1024, "speculators_version": "0.6.1.dev60"},
                               config_drop=("sample_from_anchor",))
    out = tmp_path / "out"
    rep = convert(save, tiny_verifier_dir, out)
    assert rep.format == "speculators_dspark"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sample_from_anchor"] is True  # K == B → anchor-first
    assert cfg["draft_vocab_size"] == 64
    assert "dspark-markov-misaligned" in codes(rep)
    tensors_equal(out, dspark_refs["sfa"])
    run_speculators_forward(load_with_speculators(out, tiny_verifier_dir))


def test_dspark_one_plus_n_not_warned(dspark_refs, tiny_verifier_dir, tmp_path):
    save = fp.trainer_save_dir(tmp_path / "save", {0: dspark_refs["1n"]}, config_patch={"speculators_version": "0.6.1"})
    rep = convert(save, tiny_verifier_dir)
    assert rep.plan["config"]["sample_from_anchor"] is False
    assert "dspark-markov-misaligned" not in codes(rep)


# -------------------------------------------------------------------------- other types
def test_other_speculators_type_refused(dflash_ref, tiny_verifier_dir, tmp_path):
    import shutil

    from specconv.errors import UnsupportedFormatError

    d = tmp_path / "eagle3"
    shutil.copytree(dflash_ref, d)
    cfg = fp.read_json(d / "config.json")
    cfg["speculators_model_type"] = "eagle3"
    fp.write_json(d / "config.json", cfg)
    with pytest.raises(UnsupportedFormatError, match="already a Speculators drafter") as e:
        convert(d, tiny_verifier_dir)
    assert e.value.format_id == "speculators_other"


def test_inspect_save_dir(peagle_epochs, tmp_path):
    from specconv.convert import inspect_source

    save = fp.trainer_save_dir(tmp_path / "save", peagle_epochs, best=0)
    rep = inspect_source(str(save))
    assert rep.format == "speculators_peagle" and rep.supported is True
    assert rep.path.endswith("/save/0")
    assert "training-leftovers" in {f["code"] for f in rep.findings}
